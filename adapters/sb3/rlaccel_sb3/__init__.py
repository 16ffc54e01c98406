"""rlaccel for Stable-Baselines3: tiered replay buffers, sparse/dense updates and envpool, drop-in.

Names load lazily, so the ``rlaccel`` entry point (``rlaccel_sb3.plugin``) registers this adapter
without importing Stable-Baselines3.

Examples:
    >>> from stable_baselines3 import DQN
    >>> from rlaccel_sb3 import TieredReplayBuffer
    >>> model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=TieredReplayBuffer,
    ...             replay_buffer_kwargs=dict(preset="classic_control"))
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TieredReplayBuffer": "rlaccel_sb3.buffers",
    "TieredDictReplayBuffer": "rlaccel_sb3.buffers",
    "SparseDenseCallback": "rlaccel_sb3.callback",
    "EnvPoolVecEnv": "rlaccel_sb3.envpool_vec_env",
    "accelerate": "rlaccel_sb3.acceleration",
    "restore": "rlaccel_sb3.acceleration",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlaccel_sb3' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
