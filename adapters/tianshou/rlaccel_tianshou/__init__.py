"""rlaccel for Tianshou 2.0: tiered replay buffers and a sparse/dense algorithm wrapper, drop-in.

Names load lazily, so the ``rlaccel`` entry point (``rlaccel_tianshou.plugin``) registers this
adapter without importing Tianshou.

Examples:
    >>> from rlaccel_tianshou import TieredVectorReplayBuffer
    >>> buffer = TieredVectorReplayBuffer(20_000, 10, preset="classic_control")   # was VectorReplayBuffer(20_000, 10)
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TieredReplayBuffer": "rlaccel_tianshou.buffers",
    "TieredVectorReplayBuffer": "rlaccel_tianshou.buffers",
    "SparseDenseWrapper": "rlaccel_tianshou.wrapper",
    "SparseDenseOnPolicyWrapper": "rlaccel_tianshou.wrapper",
    "unwrap_state_dict": "rlaccel_tianshou.wrapper",
    "wrap": "rlaccel_tianshou.wrapper",
    "accelerate": "rlaccel_tianshou.acceleration",
    "tiered_buffer_like": "rlaccel_tianshou.acceleration",
    "with_rlaccel": "rlaccel_tianshou.acceleration",
    "TieredCollectorFactory": "rlaccel_tianshou.acceleration",
    "SparseDenseWrapperFactory": "rlaccel_tianshou.acceleration",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlaccel_tianshou' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
