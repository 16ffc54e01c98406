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

from rlaccel_plugins.lazy import lazy_exports

_LAZY = {
    "MinAtarCNN": "rlaccel_sb3.extractors",
    "TieredReplayBuffer": "rlaccel_sb3.buffers",
    "TieredDictReplayBuffer": "rlaccel_sb3.buffers",
    "SparseDenseCallback": "rlaccel_sb3.callback",
    "AccelerateCallback": "rlaccel_sb3.callback",
    "EnvPoolVecEnv": "rlaccel_sb3.envpool_vec_env",
    "accelerate": "rlaccel_sb3.acceleration",
    "restore": "rlaccel_sb3.acceleration",
}

__all__ = sorted(_LAZY)  # noqa: PLE0605 - the lazy table is the one list of public names


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
