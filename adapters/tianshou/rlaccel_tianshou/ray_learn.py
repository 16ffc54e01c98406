"""`learn_ray`: Tianshou off-policy training with Ray actors collecting, on this machine or a cluster.

Each actor runs Tianshou's own ``Collector`` on ``buffer.buffer_num`` envs (envpool where it pays)
with a copy of the policy and sends chunks of ``chunk_steps`` vector steps; the learner stores them
in per-env time order and runs Tianshou's own ``algorithm.update`` at ``gradient_steps_per_sample``
(:class:`~rlaccel_tianshou.async_learn.OffPolicyLearner`), whatever the number of actors. Chunks
of all actors share the buffer's env streams, so each chunk's last step is stored as truncated: an
n-step return never runs into another actor's chunk, and bootstraps from the true next observation.

Example (not run as a doctest: it starts Ray actors)::

    buffer = TieredVectorReplayBuffer(50_000, 4, preset="classic_control")
    run = learn_ray(dqn, "CartPole-v1", buffer, 50_000, actors=2)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from rlaccel_plugins.parallel.ray_actors import (
    RayActorPool,
    RayRun,
    connect,
    feed_learner,
    weightless_copy,
)
from rlaccel_tianshou.async_learn import ChunkCollector, OffPolicyLearner
from rlaccel_tianshou.envs import make_envs


class TianshouRolloutWorker:
    """Runs on a Ray actor: envs, an acting policy copy and a :class:`ChunkCollector`."""

    def __init__(self, index: int, env_id: str, n_envs: int, seed: int, policy: Any, chunk_steps: int) -> None:
        import torch

        torch.set_num_threads(1)  # an actor is one CPU of the cluster
        envs = make_envs(env_id, n_envs, seed + 1_000 * (index + 1), True)
        self.chunks = ChunkCollector(policy.to_empty(device="cpu"), envs, chunk_steps)

    def load_weights(self, weights: dict) -> None:
        self.chunks.policy.load_state_dict(weights)

    def collect(self, params: dict[str, Any]) -> tuple[tuple[list, list[float]], int]:
        if "eps_training" in params:
            self.chunks.policy.set_eps_training(params["eps_training"])
        rows, stats = self.chunks.collect()
        returns = [float(r) for r in np.asarray(getattr(stats, "returns", []))]
        return (rows, returns), sum(len(r) for r in rows)


def learn_ray(algorithm: Any, env_id: str, buffer: Any, steps: int, *, actors: int = 2, chunk_steps: int = 16,
              batch_size: int = 64, gradient_steps_per_sample: float = 0.1, sync_interval: int = 50,
              max_in_flight: int = 2, address: str | None = None,
              on_chunk: Callable[[int, list[float]], None] | None = None,
              should_stop: Callable[[], bool] | None = None, log_every: int = 10,
              on_metrics: Callable[[dict[str, float]], None] | None = None, ordered: bool = False) -> RayRun:
    """Store ``steps`` env steps collected by ``actors`` Ray actors while the learner updates.

    ``on_chunk(env_steps, episode_returns)`` runs after each stored chunk (schedules, evaluation);
    ``should_stop()`` ends training early; ``on_metrics(metrics)`` receives the Ray metrics; ``ordered``:
    the actors' chunks taken in turn, so that a seeded run is reproducible (``RayActorPool``).
    """
    connect(address)
    policy = algorithm.policy
    make_worker = functools.partial(TianshouRolloutWorker, env_id=env_id, n_envs=buffer.buffer_num, seed=_seed(),
                                    policy=weightless_copy(policy), chunk_steps=chunk_steps)
    learner = OffPolicyLearner(algorithm, buffer, steps, batch_size, gradient_steps_per_sample,
                               should_stop=should_stop, on_chunk=on_chunk, stream_break=True)
    return feed_learner(RayActorPool(make_worker, actors, max_in_flight=max_in_flight, ordered=ordered), learner,
                        sync_interval=sync_interval, on_metrics=on_metrics, log_every=log_every)


def _seed() -> int:
    return int(np.random.randint(0, 2**31 - 1))  # follows np.random.seed(spec.seed) of the run
