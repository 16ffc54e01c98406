"""Entry point of the Tianshou adapter: registers it without importing Tianshou."""

from __future__ import annotations

from typing import Any

from rlaccel_plugins.hookspecs import hookimpl
from rlaccel_plugins.plugins import AdapterSpec, mro_names

TIANSHOU_BASE = "tianshou.algorithm.algorithm_base.Algorithm"


@hookimpl
def rlaccel_register_adapters(registry: Any) -> None:
    registry.add(AdapterSpec(
        name="tianshou", framework="tianshou",
        supports="Tianshou 2.0 algorithms (tianshou.algorithm.Algorithm)",
        accelerate="rlaccel_tianshou.acceleration:accelerate", train="rlaccel_tianshou.train:TianshouTraining",
        export="rlaccel_tianshou.export:export", verified="rlaccel_tianshou.verified:CODE",
        algos={"dqn": "tianshou.algorithm:DQN"},
        install_hint='Install it with: pip install "rlaccel-plugins[tianshou]"'))


@hookimpl
def rlaccel_detect_framework(obj: Any) -> str | None:
    return "tianshou" if TIANSHOU_BASE in mro_names(obj) else None
