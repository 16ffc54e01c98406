"""rlaccel for Stable-Baselines3 (filled in by the SB3 adapter issue)."""

from __future__ import annotations

from typing import Any


def accelerate(model: Any, preset: str | None = None, **overrides: Any) -> Any:
    raise NotImplementedError("rlaccel_sb3.accelerate is not implemented yet.")
