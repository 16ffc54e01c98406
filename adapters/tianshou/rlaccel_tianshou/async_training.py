"""`train_async`: Tianshou off-policy training with collection running concurrently with the updates.

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


def train_async(algorithm: Any, envs: Any, buffer: Any, steps: int, *, batch_size: int = 64,
                gradient_steps_per_sample: float = 0.1, chunk_steps: int = 1, sync_interval: int = 50,
                on_chunk: Callable[[int, Any], None] | None = None, should_stop: Callable[[], bool] | None = None,
                max_pending: int = 16) -> int:
    """Collect ``steps`` env steps in an actor thread while the learner updates; returns env steps stored.

    ``on_chunk(env_steps, collect_stats)`` is called by the learner after each stored chunk (for
    schedules, logging, evaluation); ``should_stop()`` ends training early.

    Examples:
        >>> # train_async(dqn, DummyVectorEnv([...] * 10), TieredVectorReplayBuffer(20_000, 10), 50_000)
    """
    num_envs = len(envs)
    actor_policy = copy.deepcopy(algorithm.policy)
    lock = threading.Lock()
    staging = VectorReplayBuffer(num_envs * chunk_steps * 2, num_envs)
    actor_collector = Collector(actor_policy, envs, staging, exploration_noise=True)
    actor_collector.reset()

    def collect_chunk():  # actor thread
        actor_collector.reset_buffer(keep_statistics=True)
        with lock, torch.no_grad(), policy_within_training_step(actor_policy):  # training-time exploration
            stats = actor_collector.collect(n_step=num_envs * chunk_steps)
        rows = [staging.buffers[i][: len(staging.buffers[i])] for i in range(num_envs)]
        return rows, stats

    collector = AsyncCollector(collect_chunk, max_pending=max_pending)
    collector.start()
    stored, updates, last_sync = 0, 0, 0
    try:
        while stored < steps and not (should_stop and should_stop()):
            for rows, stats in collector.drain(wait_for=1):
                stored += _store_rows(buffer, rows)
                if on_chunk is not None:
                    on_chunk(stored, stats)
                _copy_exploration(algorithm.policy, actor_policy)  # e.g. an epsilon schedule set in on_chunk
                due = int(stored * gradient_steps_per_sample) - updates
                with policy_within_training_step(algorithm.policy):
                    for _ in range(max(due, 0)):
                        algorithm.update(sample_size=batch_size, buffer=buffer)
                updates += max(due, 0)
                if updates - last_sync >= sync_interval:
                    with lock:
                        actor_policy.load_state_dict(algorithm.policy.state_dict())
                    last_sync = updates
                if stored >= steps or (should_stop and should_stop()):
                    break
    finally:
        collector.stop()
    return stored


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
