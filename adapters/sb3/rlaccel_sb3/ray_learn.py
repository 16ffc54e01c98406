"""`learn_ray`: SB3 off-policy training with Ray actors collecting, on this machine or a cluster.

Each actor steps ``model.n_envs`` envs (envpool where it pays, as in single-machine training) with a
copy of the policy and sends chunks of ``chunk_steps`` vector steps; the learner stores each step
with SB3's own ``_store_transition`` and trains with SB3's own ``train()`` every ``train_freq`` steps
(:class:`~rlaccel_sb3.async_learn.OffPolicyLearner`), so the gradient steps per stored transition are
SB3's whatever the number of actors. Chunks of all actors go into the same ``n_envs`` env streams of
the buffer, one after the other, so the last step of each chunk is stored as a truncation
(``TimeLimit.truncated``): an n-step return never runs from one actor's chunk into another's, and
it bootstraps from that step's true next observation.

Example (not run as a doctest: it starts Ray actors)::

    from stable_baselines3 import DQN
    model = DQN("MlpPolicy", "CartPole-v1", train_freq=4)
    run = learn_ray(model, 50_000, "CartPole-v1", actors=2)
    run.metrics["ray/env_steps_per_s"]
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.vec_env import unwrap_vec_normalize

from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.parallel.ray_actors import (
    RayActorPool,
    RayRun,
    connect,
    feed_learner,
    weightless_copy,
)
from rlaccel_sb3.async_learn import OffPolicyLearner, choose_actions, replay_ratio
from rlaccel_sb3.envs import make_env

INFO_KEYS = ("terminal_observation", "TimeLimit.truncated", "episode", "is_success")


class Sb3RolloutWorker:
    """Runs on a Ray actor: ``n_envs`` envs and a CPU copy of the policy; one chunk per ``collect``."""

    def __init__(self, index: int, env_id: str, n_envs: int, seed: int, policy: Any, chunk_steps: int,
                 accelerated: bool = True) -> None:
        import torch

        torch.set_num_threads(1)  # an actor is one CPU of the cluster
        self.env = make_env(env_id, n_envs, seed + 1_000 * (index + 1), accelerated)
        self.policy, self.n_envs, self.chunk_steps = policy.to_empty(device="cpu"), n_envs, chunk_steps
        self.policy.set_training_mode(False)
        self.rng = np.random.default_rng(seed + index)
        self.obs = self.env.reset()

    def load_weights(self, weights: dict) -> None:
        self.policy.load_state_dict(weights)

    def collect(self, params: dict[str, Any]) -> tuple[list[tuple], int]:
        steps = []
        for _ in range(self.chunk_steps):
            obs = self.obs
            buffer_actions, actions = choose_actions(self.policy, self.policy.action_space, obs, self.n_envs,
                                                     epsilon=params.get("epsilon", 0.0),
                                                     random=params.get("random", False), rng=self.rng)
            new_obs, rewards, dones, infos = self.env.step(actions)
            infos = [{k: info[k] for k in INFO_KEYS if k in info} for info in infos]
            steps.append((obs, buffer_actions, new_obs, rewards, dones, infos))
            self.obs = new_obs
        return steps, self.chunk_steps * self.n_envs


def learn_ray(model: OffPolicyAlgorithm, total_timesteps: int, env_id: str, *, actors: int = 2,
              chunk_steps: int = 16, sync_interval: int = 50, max_in_flight: int = 2, callback: Any = None,
              reset_num_timesteps: bool = True, address: str | None = None, accelerated: bool = True,
              log_every: int = 10, on_metrics: Any = None, ordered: bool = False) -> RayRun:
    """Like ``model.learn`` with ``actors`` Ray actors collecting ``model.n_envs`` envs each.

    ``address``: the Ray cluster (``"auto"``, ``"HOST:PORT"``; None: join the running one or start a
    local one). ``on_metrics(metrics)`` receives the Ray metrics every ``log_every`` chunks (also
    logged as ``rlaccel/ray/*``). ``ordered``: take the actors' chunks in turn, so that a seeded run
    is reproducible (``RayActorPool``).
    """
    if not isinstance(model, OffPolicyAlgorithm):
        raise ConfigError(f"model must be an off-policy SB3 algorithm, got {type(model).__name__}. "
                        "On-policy algorithms (PPO, A2C) learn from fresh rollouts only: train them without --ray.")
    if unwrap_vec_normalize(model.env) is not None:
        raise ConfigError("Ray collection does not support VecNormalize, got a VecNormalize env. "
                         "Train on one machine (model.learn) with VecNormalize.")
    if model.action_noise is not None:
        raise ConfigError(f"Ray collection does not add action noise on the actors yet, got "
                         f"action_noise={model.action_noise!r}. Use SAC (no noise) or train on one machine.")
    connect(address)
    total_timesteps, callback = model._setup_learn(total_timesteps, callback, reset_num_timesteps)
    callback.on_training_start(locals(), globals())
    replay_ratio(model)  # validates train_freq
    make_worker = functools.partial(Sb3RolloutWorker, env_id=env_id, n_envs=model.n_envs, seed=model.seed or 0,
                                    policy=weightless_copy(model.policy), chunk_steps=chunk_steps,
                                    accelerated=accelerated)
    learner = OffPolicyLearner(model, callback, total_timesteps)

    def report(metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            model.logger.record(f"rlaccel/{key}", value)
        if on_metrics is not None:
            on_metrics(metrics)

    run = feed_learner(RayActorPool(make_worker, actors, max_in_flight=max_in_flight, ordered=ordered), learner,
                       sync_interval=sync_interval, on_metrics=report, log_every=log_every)
    callback.on_training_end()
    return run
