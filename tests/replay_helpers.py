"""Env-like streams of stacked frames for replay tests and benchmarks."""

from __future__ import annotations

import numpy as np


class StackedFrameStreams:
    """``num_envs`` streams of (k, *frame) uint8 stacks with episode ends, like a frame-stacked env.

    A reset stack repeats the first frame (as gymnasium's FrameStackObservation does); ``next_obs``
    of the last step of an episode is the terminal stack, and the next ``obs`` is a fresh reset stack.
    """

    def __init__(self, num_envs: int, stack: int = 4, frame_shape=(84, 84), mean_episode: int = 50,
                 seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_envs, self.stack, self.frame_shape, self.mean_episode = num_envs, stack, frame_shape, mean_episode
        self.obs = np.stack([self._reset_stack() for _ in range(num_envs)])

    def _frame(self) -> np.ndarray:
        return self.rng.integers(0, 256, size=self.frame_shape, dtype=np.uint8)

    def _reset_stack(self) -> np.ndarray:
        return np.repeat(self._frame()[None], self.stack, axis=0)

    def step(self):
        """Return one lock-step transition dict (obs, action, reward, next_obs, terminated, truncated)."""
        n = self.num_envs
        next_obs = np.concatenate([self.obs[:, 1:], np.stack([self._frame() for _ in range(n)])[:, None]], axis=1)
        done = self.rng.random(n) < 1.0 / self.mean_episode
        truncated = done & (self.rng.random(n) < 0.3)
        terminated = done & ~truncated
        transition = dict(obs=self.obs.copy(), action=self.rng.integers(0, 6, n), reward=self.rng.random(n).astype(np.float32),
                          next_obs=next_obs, terminated=terminated, truncated=truncated)
        self.obs = next_obs.copy()
        for i in np.flatnonzero(done):
            self.obs[i] = self._reset_stack()
        return transition
