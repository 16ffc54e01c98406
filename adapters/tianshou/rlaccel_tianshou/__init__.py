"""rlaccel for Tianshou 2.0 (filled in by the Tianshou adapter issue)."""

from __future__ import annotations

from typing import Any


def accelerate(algorithm: Any, preset: str | None = None, **overrides: Any) -> Any:
    raise NotImplementedError("rlaccel_tianshou.accelerate is not implemented yet.")
