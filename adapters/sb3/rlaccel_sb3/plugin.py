"""Entry point of the SB3 adapter: registers it without importing Stable-Baselines3."""

from __future__ import annotations

from typing import Any

from rlaccel_plugins.hookspecs import hookimpl
from rlaccel_plugins.plugins import AdapterSpec, mro_names

SB3_BASE = "stable_baselines3.common.base_class.BaseAlgorithm"


@hookimpl
def rlaccel_register_adapters(registry: Any) -> None:
    registry.add(AdapterSpec(
        name="sb3", framework="stable_baselines3",
        supports="Stable-Baselines3 / sb3-contrib models (BaseAlgorithm)",
        accelerate="rlaccel_sb3.acceleration:accelerate", train="rlaccel_sb3.train:Sb3Training",
        export="rlaccel_sb3.export:export", verified="rlaccel_sb3.verified:CODE",
        recipes="rlaccel_sb3.train:zoo_settings",
        algos={name.lower(): f"{package}:{name}" for package, name in (
            ("stable_baselines3", "DQN"), ("sb3_contrib", "QRDQN"), ("stable_baselines3", "SAC"),
            ("stable_baselines3", "TD3"), ("stable_baselines3", "DDPG"), ("stable_baselines3", "PPO"),
            ("stable_baselines3", "A2C"))},
        install_hint='Install it with: pip install "rlaccel-plugins[sb3]"'))


@hookimpl
def rlaccel_detect_framework(obj: Any) -> str | None:
    return "sb3" if SB3_BASE in mro_names(obj) else None
