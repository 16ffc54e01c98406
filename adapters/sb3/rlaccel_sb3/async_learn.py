"""`learn_async`: SB3 off-policy training with collection running concurrently with the updates.

An actor thread steps the VecEnv with its own copy of the policy (batched inference for all envs,
epsilon-greedy for DQN, stochastic or noisy actions for SAC/TD3/DDPG, random during
``learning_starts``); the learner thread stores each chunk with SB3's own ``_store_transition`` (so
terminal observations and timeouts are handled as usual), runs SB3's own ``_on_step`` (target
updates, exploration schedule) and callbacks, and after every ``train_freq`` env steps calls SB3's
own ``train(gradient_steps)`` — SB3's rollout structure and replay ratio exactly, while the actor
already collects the next rollout. (Training in small slices instead would move DQN's target
network, which SB3 updates per env step, far more often per gradient step, and DQN stops learning.) The actor's policy copy
is refreshed every ``sync_interval`` gradient steps (SEED.md §2: ``sync_interval``).
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

from rlaccel_plugins.parallel.async_collect import AsyncCollector

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
        raise TypeError(f"model must be an off-policy SB3 algorithm, got {type(model).__name__}.")
    if unwrap_vec_normalize(model.env) is not None:
        raise ValueError("async collection does not support VecNormalize yet, got a VecNormalize env. "
                         "Train synchronously (model.learn) with VecNormalize.")
    total_timesteps, callback = model._setup_learn(total_timesteps, callback, reset_num_timesteps)
    callback.on_training_start(locals(), globals())
    replay_ratio(model)  # validates train_freq
    actor = copy.deepcopy(model.policy)  # the acting copy; the learner trains model.policy
    actor.set_training_mode(False)
    lock = threading.Lock()
    env, n_envs = model.env, model.n_envs
    rng = np.random.default_rng(model.seed)
    state = {"obs": model._last_obs}

    def step():  # actor thread: inference with the policy copy, then one vector env step
        obs = state["obs"]
        if model.num_timesteps < model.learning_starts:
            unscaled = np.array([model.action_space.sample() for _ in range(n_envs)])
        else:
            with lock, torch.no_grad():
                unscaled, _ = actor.predict(obs, deterministic=False)
            explore = getattr(model, "exploration_rate", 0.0)
            if explore > 0:
                random = rng.random(n_envs) < explore
                if random.any():
                    unscaled = unscaled.copy()
                    unscaled[random] = [model.action_space.sample() for _ in range(int(random.sum()))]
        if isinstance(model.action_space, spaces.Box):
            scaled = actor.scale_action(unscaled)
            if model.action_noise is not None:
                scaled = np.clip(scaled + model.action_noise(), -1, 1)
            buffer_actions, actions = scaled, actor.unscale_action(scaled)
        else:
            buffer_actions = actions = unscaled
        new_obs, rewards, dones, infos = env.step(actions)
        if model.action_noise is not None:
            for i in np.flatnonzero(dones):
                model.action_noise.reset(**(dict(indices=[i]) if n_envs > 1 else {}))
        state["obs"] = new_obs
        return obs, buffer_actions, new_obs, rewards, dones, infos

    # the actor may run a whole rollout ahead, so collecting rollout k+1 overlaps training on rollout k
    collector = AsyncCollector(step, max_pending=max(max_pending, model.train_freq.frequency))
    collector.start()
    gradient_steps_done, last_sync, rollout_steps, stop = 0, 0, 0, False
    try:
        while model.num_timesteps < total_timesteps and not stop:
            for obs, buffer_actions, new_obs, rewards, dones, infos in collector.drain(wait_for=1):
                if model.num_timesteps >= total_timesteps:
                    break  # collected beyond the budget: not stored, as SB3 would not have collected it
                stop = not _store(model, callback, obs, buffer_actions, new_obs, rewards, dones, infos,
                                  total_timesteps)
                if stop:
                    break
                rollout_steps += 1
                if rollout_steps < model.train_freq.frequency:
                    continue
                # a rollout as SB3 counts it is complete: SB3's own update, as in its synchronous loop
                callback.on_rollout_end()
                rollout_steps = 0
                if model.num_timesteps > model.learning_starts:
                    steps = model.gradient_steps if model.gradient_steps >= 0 else \
                        model.train_freq.frequency * model.n_envs
                    if steps > 0:
                        model.train(gradient_steps=steps, batch_size=model.batch_size)
                        gradient_steps_done += steps
                if gradient_steps_done - last_sync >= sync_interval:
                    with lock:
                        actor.load_state_dict(model.policy.state_dict())
                    last_sync = gradient_steps_done
                callback.on_rollout_start()
    finally:
        collector.stop()  # chunks produced past the budget are dropped, never half-stored
    callback.on_training_end()
    return model


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
    model._episode_num += int(np.sum(dones))
    return True
