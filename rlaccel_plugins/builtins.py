"""rlaccel's own features, registered through the same hooks a third-party plugin uses."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from rlaccel_plugins.hookspecs import hookimpl

REPORTED_PACKAGES = ("rlaccel-plugins", "torch", "numpy", "stable-baselines3", "sb3-contrib", "tianshou",
                     "gymnasium", "envpool", "ale-py", "pluggy")


@hookimpl
def rlaccel_env_report() -> dict[str, str]:
    from rlaccel_plugins.hardware import cpu_count, gpu_info, resolve_auto
    from rlaccel_plugins.loader import load_config

    lines = {"python": platform.python_version(), "platform": platform.platform()}
    for package in REPORTED_PACKAGES:
        try:
            lines[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            lines[package] = "not installed"
    _device, gpu_name = gpu_info()
    lines["cpu cores (usable)"] = str(cpu_count())
    lines["gpu"] = gpu_name or "none"
    auto = resolve_auto(load_config(preset="default", parallel_envs="auto", device="auto",
                                    num_threads="auto", precision="auto"))
    lines["auto parallel_envs"] = str(auto.parallel_envs)
    lines["auto device"] = auto.device
    lines["auto num_threads"] = str(auto.num_threads)
    lines["auto precision"] = auto.precision
    return lines


@hookimpl(trylast=True)  # plugins with their own backends answer first
def rlaccel_make_env(env_id: str, num_envs: int, backend: str, seed: int, config: Any,
                     env_kwargs: dict[str, Any]) -> Any:
    from rlaccel_plugins.parallel.factory import build_builtin_env

    return build_builtin_env(env_id, num_envs, backend, seed, dict(env_kwargs))


@hookimpl(tryfirst=True)
def rlaccel_add_commands(subparsers: Any) -> None:
    from rlaccel_plugins import cli

    cli.add_core_commands(subparsers)
