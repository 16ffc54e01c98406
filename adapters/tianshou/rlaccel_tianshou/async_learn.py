"""`learn_async`: Tianshou off-policy training with collection running concurrently with the updates.

The actor thread runs Tianshou's own ``Collector`` with a copy of the policy on the training envs,
``chunk_steps`` vector steps at a time, into a small staging buffer of its own; the learner thread
moves each chunk into the real (tiered) buffer in per-env time order — only the learner ever writes
it — and calls Tianshou's own ``algorithm.update`` to keep ``update_step_num_gradient_steps_per_sample``.
The acting copy is refreshed every ``sync_interval`` updates.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tianshou.data import Batch, Collector, VectorReplayBuffer
from tianshou.utils.torch_utils import policy_within_training_step

from rlaccel_plugins.parallel.async_collect import AsyncCollector
from rlaccel_plugins.parallel.ray_actors import cpu_weights
from rlaccel_tianshou.kernel_cache import cache_tianshou_kernels

cache_tianshou_kernels()  # before anything here compiles Tianshou's numba kernels


def learn_async(algorithm: Any, envs: Any, buffer: Any, steps: int, *, batch_size: int = 64,
                gradient_steps_per_sample: float = 0.1, chunk_steps: int = 1, sync_interval: int = 50,
                on_chunk: Callable[[int, Any], None] | None = None, should_stop: Callable[[], bool] | None = None,
                max_pending: int = 16) -> int:
    """Collect ``steps`` env steps in an actor thread while the learner updates; returns env steps stored.

    ``on_chunk(env_steps, collect_stats)`` is called by the learner after each stored chunk (for
    schedules, logging, evaluation); ``should_stop()`` ends training early.

    Example (not run as a doctest: it trains for minutes; ``tests/tianshou/test_tianshou_adapter.py`` runs it)::

        learn_async(dqn, DummyVectorEnv([...] * 10), TieredVectorReplayBuffer(20_000, 10), 50_000)
    """
    actor_policy = copy.deepcopy(algorithm.policy)
    lock = threading.Lock()
    chunks = ChunkCollector(actor_policy, envs, chunk_steps)

    def collect_chunk():  # actor thread
        with lock:
            return chunks.collect()

    collector = AsyncCollector(collect_chunk, max_pending=max_pending)
    collector.start()
    learner = OffPolicyLearner(algorithm, buffer, steps, batch_size, gradient_steps_per_sample,
                               should_stop=should_stop, on_chunk=on_chunk)
    last_sync = 0
    try:
        while not learner.finished:
            for chunk in collector.drain(wait_for=1):
                learner.store_chunk(chunk)
                _copy_exploration(algorithm.policy, actor_policy)  # e.g. an epsilon schedule set in on_chunk
                if learner.gradient_steps - last_sync >= sync_interval:
                    with lock:
                        actor_policy.load_state_dict(algorithm.policy.state_dict())
                    last_sync = learner.gradient_steps
                if learner.finished:
                    break
    finally:
        collector.stop()
    return learner.stored


class ChunkCollector:
    """Tianshou's own ``Collector`` with an acting copy of the policy, ``chunk_steps`` vector steps at
    a time into a small staging buffer of its own; :meth:`collect` returns each env's steps in order."""

    def __init__(self, policy: Any, envs: Any, chunk_steps: int) -> None:
        self.policy, self.num_envs, self.chunk_steps = policy, len(envs), chunk_steps
        self.staging = VectorReplayBuffer(self.num_envs * chunk_steps * 2, self.num_envs)
        self.collector = Collector(policy, envs, self.staging, exploration_noise=True)
        self.collector.reset()

    def collect(self) -> tuple[list[Batch], Any]:
        self.collector.reset_buffer(keep_statistics=True)
        with torch.no_grad(), policy_within_training_step(self.policy):  # training-time exploration
            stats = self.collector.collect(n_step=self.num_envs * self.chunk_steps)
        return [self.staging.buffers[i][: len(self.staging.buffers[i])] for i in range(self.num_envs)], stats


class OffPolicyLearner:
    """Tianshou's side of training on chunks collected elsewhere (an actor thread, Ray actors): each
    chunk goes into the buffer in per-env time order, then Tianshou's own ``algorithm.update`` runs as
    often as ``gradient_steps_per_sample`` asks for what has been stored. It is the core's
    :class:`~rlaccel_plugins.parallel.learner.Learner` (a chunk: ``(rows, info)`` with ``rows`` a
    ``Batch`` of consecutive steps per env; ``on_chunk(env_steps, info)`` runs after storing it;
    ``stream_break``: chunks come from other processes, see :meth:`store`)."""

    def __init__(self, algorithm: Any, buffer: Any, steps: int, batch_size: int,
                 gradient_steps_per_sample: float, *, should_stop: Callable[[], bool] | None = None,
                 on_chunk: Callable[[int, Any], None] | None = None, stream_break: bool = False) -> None:
        self.algorithm, self.buffer, self.steps = algorithm, buffer, steps
        self.batch_size, self.gradient_steps_per_sample = batch_size, gradient_steps_per_sample
        self.should_stop, self.on_chunk, self.stream_break = should_stop, on_chunk, stream_break
        self.stored = self.gradient_steps = 0

    @property
    def finished(self) -> bool:
        return self.stored >= self.steps or bool(self.should_stop and self.should_stop())

    def store_chunk(self, payload: tuple[list[Batch], Any]) -> int:
        if self.finished:
            return 0  # arrived after the budget was spent: acknowledged, not stored
        rows, info = payload
        added = self.store(rows, stream_break=self.stream_break)
        if self.on_chunk is not None:
            self.on_chunk(self.stored, info)
        self.update()
        return added

    def weights(self) -> dict[str, Any]:
        return cpu_weights(self.algorithm.policy)

    def exploration(self) -> dict[str, Any]:
        policy = self.algorithm.policy
        return {"eps_training": float(policy.eps_training)} if hasattr(policy, "eps_training") else {}

    def store(self, rows: list[Batch], stream_break: bool = False) -> int:
        """Add one chunk (a ``Batch`` of consecutive steps per env); ``stream_break``: the next chunk in
        these env streams may come from elsewhere, so the last step is stored as a truncation."""
        if stream_break:
            rows = [_truncated_at_end(r) for r in rows]
        added = _store_rows(self.buffer, rows)
        self.stored += added
        return added

    def update(self) -> None:
        due = int(self.stored * self.gradient_steps_per_sample) - self.gradient_steps
        with policy_within_training_step(self.algorithm.policy):
            for _ in range(max(due, 0)):
                self.algorithm.update(sample_size=self.batch_size, buffer=self.buffer)
        self.gradient_steps += max(due, 0)


def _truncated_at_end(rows: Batch) -> Batch:
    if len(rows) == 0 or rows.terminated[-1] or rows.truncated[-1]:
        return rows
    rows = copy.deepcopy(rows)
    rows.truncated[-1] = True
    if "done" in rows.keys():  # noqa: SIM118 (Batch is not a dict)
        rows.done[-1] = True
    return rows


def _store_rows(buffer: Any, rows: list[Batch]) -> int:
    """Add each env's chunk to the shared buffer in time order, envs side by side (lock-step)."""
    length = min(len(r) for r in rows)
    for t in range(length):
        batch = Batch.stack([r[t] for r in rows])
        buffer.add(batch, buffer_ids=np.arange(len(rows)))
    return length * len(rows)


def _copy_exploration(source: Any, target: Any) -> None:
    for attr in ("eps_training", "eps_inference"):
        if hasattr(source, attr):
            setattr(target, attr, getattr(source, attr))
