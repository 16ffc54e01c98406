"""`learn_async`: SB3 off-policy training with collection running concurrently with the updates.

An actor thread steps the VecEnv with its own copy of the policy (batched inference for all envs,
epsilon-greedy for DQN, stochastic or noisy actions for SAC/TD3/DDPG, random during
``learning_starts``); the learner thread stores each chunk with SB3's own ``_store_transition`` (so
terminal observations and timeouts are handled as usual), runs SB3's own ``_on_step`` (target
updates, exploration schedule) and callbacks, and after every ``train_freq`` env steps calls SB3's
own ``train(gradient_steps)`` — SB3's rollout structure and replay ratio exactly, while the actor
already collects the next rollout. (Training in small slices instead would move DQN's target
network, which SB3 updates per env step, far more often per gradient step, and DQN stops learning.) The actor's policy copy
is refreshed every ``sync_interval`` gradient steps (``training.sync_interval``).
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.vec_env import unwrap_vec_normalize

from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.parallel.async_collect import AsyncCollector
from rlaccel_plugins.parallel.ray_actors import cpu_weights


def replay_ratio(model: OffPolicyAlgorithm) -> float:
    """Gradient steps per collected transition in SB3's own loop."""
    per_rollout_transitions = model.train_freq.frequency * model.n_envs
    if model.train_freq.unit.value != "step":
        raise ValueError(f"train_freq must count steps for async collection, got train_freq={model.train_freq}. "
                         "Use train_freq=(N, 'step').")
    steps = model.gradient_steps if model.gradient_steps >= 0 else per_rollout_transitions
    return steps / per_rollout_transitions


def learn_async(model: OffPolicyAlgorithm, total_timesteps: int, callback: Any = None, sync_interval: int = 50,
                max_pending: int = 16, reset_num_timesteps: bool = True) -> OffPolicyAlgorithm:
    """Like ``model.learn`` but with an actor thread collecting while the learner trains.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> from rlaccel_sb3.async_learn import learn_async
        >>> model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4)
        >>> _ = learn_async(model, 500)
        >>> model.num_timesteps
        500
    """
    if not isinstance(model, OffPolicyAlgorithm):
        raise ConfigError(f"model must be an off-policy SB3 algorithm, got {type(model).__name__}.")
    if unwrap_vec_normalize(model.env) is not None:
        raise ValueError("async collection does not support VecNormalize yet, got a VecNormalize env. "
                         "Train synchronously (model.learn) with VecNormalize.")
    total_timesteps, callback = model._setup_learn(total_timesteps, callback, reset_num_timesteps)
    callback.on_training_start(locals(), globals())
    graphs = getattr(model.__dict__.get("train"), "graphs", None)
    if graphs is not None:  # the actor thread launches kernels while a graph would be captured: no graphs
        graphs.cuda_graphs = False
    replay_ratio(model)  # validates train_freq
    actor = copy.deepcopy(model.policy)  # the acting copy; the learner trains model.policy
    actor.set_training_mode(False)
    lock = threading.Lock()
    env, n_envs = model.env, model.n_envs
    rng = np.random.default_rng(model.seed)
    state = {"obs": model._last_obs}

    def step():  # actor thread: inference with the policy copy, then one vector env step
        obs = state["obs"]
        with lock:
            buffer_actions, actions = choose_actions(
                actor, model.action_space, obs, n_envs, epsilon=getattr(model, "exploration_rate", 0.0),
                random=model.num_timesteps < model.learning_starts, action_noise=model.action_noise, rng=rng)
        new_obs, rewards, dones, infos = env.step(actions)
        if model.action_noise is not None:
            for i in np.flatnonzero(dones):
                model.action_noise.reset(**(dict(indices=[i]) if n_envs > 1 else {}))
        state["obs"] = new_obs
        return obs, buffer_actions, new_obs, rewards, dones, infos

    # the actor may run a whole rollout ahead, so collecting rollout k+1 overlaps training on rollout k
    collector = AsyncCollector(step, max_pending=max(max_pending, model.train_freq.frequency))
    collector.start()
    learner, last_sync = OffPolicyLearner(model, callback, total_timesteps), 0
    try:
        while not learner.finished:
            for transition in collector.drain(wait_for=1):
                learner.store(*transition)
                if learner.finished:
                    break
                if learner.gradient_steps - last_sync >= sync_interval:
                    with lock:
                        actor.load_state_dict(model.policy.state_dict())
                    last_sync = learner.gradient_steps
    finally:
        collector.stop()  # chunks produced past the budget are dropped, never half-stored
    callback.on_training_end()
    return model


def choose_actions(policy, action_space: spaces.Space, obs, n_envs: int, *, epsilon: float = 0.0,
                   random: bool = False, action_noise=None, rng: np.random.Generator):
    """Batched actions of ``policy`` for ``n_envs`` observations as SB3's ``_sample_action`` makes them
    (random before ``learning_starts``, epsilon-greedy, noise for Box actions); returns the actions to
    store (scaled to [-1, 1] for Box spaces) and the actions to send to the env."""
    if random:
        unscaled = np.array([action_space.sample() for _ in range(n_envs)])
    else:
        with torch.no_grad():
            unscaled, _ = policy.predict(obs, deterministic=False)
        if epsilon > 0:
            explore = rng.random(n_envs) < epsilon
            if explore.any():
                unscaled = unscaled.copy()
                unscaled[explore] = [action_space.sample() for _ in range(int(explore.sum()))]
    if isinstance(action_space, spaces.Box):
        scaled = policy.scale_action(unscaled)
        if action_noise is not None:
            scaled = np.clip(scaled + action_noise(), -1, 1)
        return scaled, policy.unscale_action(scaled)
    return unscaled, unscaled


class OffPolicyLearner:
    """SB3's side of its own ``collect_rollouts`` + ``train`` loop, fed with transitions collected
    elsewhere (an actor thread, Ray actors): SB3's per-step bookkeeping and callbacks for each vector
    step, and SB3's own ``train(gradient_steps)`` after every ``train_freq`` steps. It is the core's
    :class:`~rlaccel_plugins.parallel.learner.Learner` (a chunk: a list of vector steps)."""

    def __init__(self, model: OffPolicyAlgorithm, callback: Any, total_timesteps: int, log_interval: int = 4) -> None:
        self.model, self.callback, self.total_timesteps = model, callback, total_timesteps
        self.log_interval = log_interval  # SB3's off-policy default
        self.gradient_steps = 0
        self.stopped = False  # a callback asked to stop
        self._rollout_steps = 0

    @property
    def finished(self) -> bool:
        return self.stopped or self.model.num_timesteps >= self.total_timesteps

    def store(self, obs, buffer_actions, new_obs, rewards, dones, infos) -> bool:
        """Store one vector step (False, not stored: the budget is spent or training was stopped)."""
        model = self.model
        if self.finished:
            return False  # collected beyond the budget: not stored, as SB3 would not have collected it
        if not _store(model, self.callback, obs, buffer_actions, new_obs, rewards, dones, infos,
                      self.total_timesteps):
            self.stopped = True
            return False
        for _ in range(int(np.sum(dones))):  # SB3 writes its logs (TensorBoard, stdout) every log_interval episodes
            model._episode_num += 1
            if self.log_interval and model._episode_num % self.log_interval == 0:
                model.dump_logs()
        self._rollout_steps += 1
        if self._rollout_steps < model.train_freq.frequency:
            return True
        # a rollout as SB3 counts it is complete: SB3's own update, as in its synchronous loop
        self.callback.on_rollout_end()
        self._rollout_steps = 0
        if model.num_timesteps > model.learning_starts:
            steps = model.gradient_steps if model.gradient_steps >= 0 else model.train_freq.frequency * model.n_envs
            if steps > 0:
                model.train(gradient_steps=steps, batch_size=model.batch_size)
                self.gradient_steps += steps
        self.callback.on_rollout_start()
        return True

    def store_chunk(self, steps: list[tuple]) -> int:
        """Store a chunk of vector steps from another process; its last step is stored as a truncation,
        since the next step of these buffer streams is another chunk (possibly another actor's)."""
        stored, last = 0, len(steps) - 1
        for t, (obs, buffer_actions, new_obs, rewards, dones, infos) in enumerate(steps):
            if t == last:
                infos = _stream_break(infos, dones)
            stored += self.model.n_envs if self.store(obs, buffer_actions, new_obs, rewards, dones, infos) else 0
        return stored

    def weights(self) -> dict[str, Any]:
        return cpu_weights(self.model.policy)

    def exploration(self) -> dict[str, Any]:
        """SB3's exploration now: epsilon (DQN), and uniform random actions before ``learning_starts``."""
        model = self.model
        return {"epsilon": float(getattr(model, "exploration_rate", 0.0)),
                "random": model.num_timesteps < model.learning_starts}


def _stream_break(infos: list[dict], dones: np.ndarray) -> list[dict]:
    """Mark the envs still running as truncated here. Copies, so the episode accounting sees the infos
    unchanged."""
    return [info if done else {**info, "TimeLimit.truncated": True} for info, done in zip(infos, dones)]


def _store(model, callback, obs, buffer_actions, new_obs, rewards, dones, infos, total_timesteps) -> bool:
    """SB3's per-env-step bookkeeping for one collected chunk; False when a callback stops training."""
    model._last_obs = obs
    model.num_timesteps += model.n_envs
    callback.update_locals({"new_obs": new_obs, "rewards": rewards, "dones": dones, "infos": infos})
    if not callback.on_step():
        return False
    model._update_info_buffer(infos, dones)
    model._store_transition(model.replay_buffer, buffer_actions, new_obs, rewards, dones, infos)
    model._update_current_progress_remaining(model.num_timesteps, total_timesteps)
    model._on_step()
    return True
