"""rlaccel for Stable-Baselines3: tiered replay buffers, sparse/dense updates and envpool, drop-in.

Examples:
    >>> from stable_baselines3 import DQN
    >>> from rlaccel_sb3 import TieredReplayBuffer
    >>> model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=TieredReplayBuffer,
    ...             replay_buffer_kwargs=dict(preset="classic_control"))
"""

from __future__ import annotations

from rlaccel_sb3.accelerate import accelerate, restore
from rlaccel_sb3.buffers import TieredDictReplayBuffer, TieredReplayBuffer
from rlaccel_sb3.callback import SparseDenseCallback
from rlaccel_sb3.envpool_vec_env import EnvPoolVecEnv

__all__ = ["EnvPoolVecEnv", "SparseDenseCallback", "TieredDictReplayBuffer", "TieredReplayBuffer", "accelerate",
           "restore"]
