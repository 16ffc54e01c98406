"""The Tianshou env builder of `rlaccel train`, its async learner and Ray actors."""

from __future__ import annotations

import gymnasium as gym
from tianshou.env import DummyVectorEnv

from rlaccel_plugins.parallel.factory import choose_backend, make_vec_env
from rlaccel_plugins.tasks import ensure_registered
from rlaccel_tianshou.kernel_cache import cache_tianshou_kernels

cache_tianshou_kernels()  # before anything here compiles Tianshou's numba kernels


def make_envs(env_id: str, n: int, seed: int, envpool_ok: bool):
    """``n`` copies of ``env_id`` for a Tianshou collector: envpool (through :func:`make_vec_env`, so a
    plugin's ``rlaccel_make_env`` answers first) where the factory says it pays, else a
    ``DummyVectorEnv``."""
    ensure_registered(env_id)
    if envpool_ok and choose_backend(env_id, "auto", n) == "envpool":
        return make_vec_env(env_id, num_envs=n, backend="envpool", seed=seed)
    venv = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    venv.seed(seed)
    return venv
