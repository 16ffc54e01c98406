"""The replay batches of a fused off-policy ``train()``: every gradient step's batch drawn first, by the
buffer's own ``sample()`` (the same RNG draws in the same order), stacked into one tensor per field —
or, for SB3's ``ReplayBuffer`` and rlaccel's tiered buffers, the same draws made in order and the rows
of all batches gathered at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces


class Batches:
    """``gradient_steps`` replay samples stacked: field tensors of shape ``(k, batch, ...)``."""

    def __init__(self, observations, actions, next_observations, dones, rewards, discounts=None,
                 weights: torch.Tensor | None = None) -> None:
        self.observations, self.actions, self.next_observations = observations, actions, next_observations
        self.dones, self.rewards, self.discounts, self.weights = dones, rewards, discounts, weights
        self.k = len(actions)

    @classmethod
    def stacked(cls, samples: list, weights: list[np.ndarray | None]) -> Batches:
        first = samples[0]
        return cls(_stack([s.observations for s in samples]), torch.stack([s.actions for s in samples]),
                   _stack([s.next_observations for s in samples]), torch.stack([s.dones for s in samples]),
                   torch.stack([s.rewards for s in samples]),
                   torch.stack([s.discounts for s in samples]) if first.discounts is not None else None,
                   None if weights[0] is None else torch.as_tensor(np.stack(weights), device=first.rewards.device))

    def step(self, i: int) -> tuple[Any, torch.Tensor]:
        return step_of(self.observations, i), self.actions[i]


CHUNK_BYTES = 64 * 2**20  # the most observation bytes drawn ahead at once (Atari frames: a few steps)


def iter_batches(model, gradient_steps: int, batch_size: int):
    """:func:`draw_batches` for ``gradient_steps`` steps in chunks of at most ``CHUNK_BYTES`` of
    observations: all of them at once for vector observations, a few steps at a time for images (one
    gather of 100 batches of 512 Atari frames would be 2.9 GB). The draws keep SB3's order."""
    per_step = max(1, 2 * batch_size * _observation_bytes(model.observation_space))
    chunk = max(1, min(gradient_steps, CHUNK_BYTES // per_step))
    for start in range(0, gradient_steps, chunk):
        yield draw_batches(model, min(chunk, gradient_steps - start), batch_size)


def _observation_bytes(space) -> int:
    if isinstance(space, spaces.Dict):
        return sum(_observation_bytes(s) for s in space.spaces.values())
    return int(np.prod(space.shape or (1,))) * np.dtype(space.dtype or np.float32).itemsize


def draw_batches(model, gradient_steps: int, batch_size: int) -> Batches:
    """Sample as SB3's ``train()`` would over ``gradient_steps`` steps, all at once."""
    from stable_baselines3.common.buffers import ReplayBuffer

    buffer = model.replay_buffer
    if type(buffer) is ReplayBuffer and model._vec_normalize_env is None:
        return _draw_from_replay_buffer(buffer, gradient_steps, batch_size)
    if _tiered_sample(buffer):
        return _draw_from_tiered_buffer(buffer, gradient_steps, batch_size, model._vec_normalize_env)
    samples, weights = [], []
    applied_by = getattr(buffer, "weights_applied_by", None)
    if hasattr(buffer, "weights_applied_by"):
        buffer.weights_applied_by = draw_batches  # the fused loss applies the importance weights itself
    try:
        for _ in range(gradient_steps):
            samples.append(buffer.sample(batch_size, env=model._vec_normalize_env))
            weights.append(getattr(buffer, "last_weights", None))
    finally:
        if hasattr(buffer, "weights_applied_by"):
            buffer.weights_applied_by = applied_by
    return Batches.stacked(samples, weights)


def _draw_from_replay_buffer(buffer, k: int, batch_size: int) -> Batches:
    """SB3's own ``ReplayBuffer.sample`` ``k`` times — the same numpy draws in the same order — with
    the rows gathered once for all ``k`` batches instead of once per batch."""
    rows, envs = [], []
    for _ in range(k):
        if not buffer.optimize_memory_usage:
            rows.append(np.random.randint(0, buffer.buffer_size if buffer.full else buffer.pos, size=batch_size))
        elif buffer.full:
            rows.append((np.random.randint(1, buffer.buffer_size, size=batch_size) + buffer.pos) % buffer.buffer_size)
        else:
            rows.append(np.random.randint(0, buffer.pos, size=batch_size))
        envs.append(np.random.randint(0, high=buffer.n_envs, size=(batch_size,)))
    b, e = np.concatenate(rows), np.concatenate(envs)
    if buffer.optimize_memory_usage:
        next_obs = buffer.observations[(b + 1) % buffer.buffer_size, e, :]
    else:
        next_obs = buffer.next_observations[b, e, :]
    dones = (buffer.dones[b, e] * (1 - buffer.timeouts[b, e])).reshape(-1, 1)

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=buffer.device).reshape(k, batch_size, *array.shape[1:])

    return Batches(tensor(buffer.observations[b, e, :]), tensor(buffer.actions[b, e, :]), tensor(next_obs),
                    tensor(dones), tensor(buffer.rewards[b, e].reshape(-1, 1)))


def _tiered_sample(buffer) -> bool:
    """Whether ``buffer`` samples as rlaccel's tiered buffer does (not a subclass with its own sampling)."""
    from rlaccel_sb3.buffers import TieredBufferMixin

    return isinstance(buffer, TieredBufferMixin) and all(
        getattr(type(buffer), name) is getattr(TieredBufferMixin, name) for name in ("sample", "_get_samples"))


def _draw_from_tiered_buffer(buffer, k: int, batch_size: int, env) -> Batches:
    """rlaccel's tiered buffer's ``sample()`` ``k`` times — the same draws in the same order — with the
    rows of all ``k`` batches gathered at once (``TieredReplayBuffer.sample_steps``)."""
    sample, weights = buffer.sample_steps(k, batch_size, env=env)

    def steps(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: v.reshape(k, batch_size, *v.shape[1:]) for key, v in value.items()}
        return value.reshape(k, batch_size, *value.shape[1:])

    return Batches(steps(sample.observations), steps(sample.actions), steps(sample.next_observations),
                   steps(sample.dones), steps(sample.rewards),
                   None if sample.discounts is None else steps(sample.discounts),
                   None if weights[0] is None else torch.as_tensor(np.stack(weights), device=sample.rewards.device))


def _stack(values: list) -> Any:
    if isinstance(values[0], dict):
        return {key: torch.stack([v[key] for v in values]) for key in values[0]}
    return torch.stack(values)


def step_of(value: Any, i: int) -> Any:
    return {key: v[i] for key, v in value.items()} if isinstance(value, dict) else value[i]


def flatten_steps(value: Any) -> Any:
    """``(k, batch, ...)`` → ``(k * batch, ...)``."""
    if isinstance(value, dict):
        return {key: v.reshape(-1, *v.shape[2:]) for key, v in value.items()}
    return value.reshape(-1, *value.shape[2:])
