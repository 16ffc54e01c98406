"""Lean off-policy ``collect_rollouts`` for SB3: SB3's loop, step for step, without the work no result
depends on.

Per vector step SB3's ``OffPolicyAlgorithm.collect_rollouts`` asks ``_sample_action`` for the action
(lean: :mod:`rlaccel_sb3.collection`), steps the VecEnv, hands the callbacks its ``locals()``, updates
the episode statistics, stores the transition (``_store_transition``: a ``deepcopy`` of the
observation, then the buffer's ``add``) and calls ``_on_step`` (DQN / QR-DQN: the exploration schedule
and, every ``target_update_interval`` steps, a Polyak update that walks both networks' modules to list
their parameters). :func:`lean_off_policy_methods` gives the model lean versions of those methods —
each one SB3's code with the same calls, values and random draws:

- ``_sample_action``: :func:`rlaccel_sb3.collection.lean_sample_action_for`;
- ``collect_rollouts``: SB3's loop with its helpers inlined where they are SB3's own (the
  ``should_collect_more_steps`` test, the episode-statistics update, the progress update); the
  callbacks get the same ``locals()`` (the same names and values) once per vector step;
- ``_store_transition``: the observation copied only where a terminal observation replaces a row
  (SB3's buffers copy what they store: the ``deepcopy`` only protects ``new_obs`` from that
  replacement), for SB3's ``ReplayBuffer`` / ``NStepReplayBuffer`` and rlaccel's ``TieredReplayBuffer``
  without VecNormalize; SB3's own elsewhere;
- DQN / QR-DQN's ``_on_step``: the same Polyak update (``mul_`` then ``add``) on parameter lists
  made once, in multi-tensor kernels.

``AccelerateCallback`` installs them for ``learn()`` (``training.fused_collection``); each is left
out where the model's class overrides the method it replaces. Equivalence is tested step by step in
``tests/equivalence/test_sb3_collection.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from copy import deepcopy

import numpy as np
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFrequencyUnit
from stable_baselines3.common.vec_env import VecEnv

from rlaccel_sb3.training_mode import set_training_mode

# the SB3 methods whose code the lean collect_rollouts inlines: it is used only where they are SB3's own
_INLINED = ("_update_info_buffer", "_update_current_progress_remaining")


def lean_off_policy_methods(model) -> dict[str, Callable]:
    """The lean methods for ``model`` (name -> method of the model), each only where the model's class
    runs SB3's own; empty for on-policy models.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> model = DQN("MlpPolicy", "CartPole-v1", learning_starts=0)
        >>> sorted(lean_off_policy_methods(model))
        ['_on_step', '_sample_action', '_store_transition', 'collect_rollouts']
    """
    from rlaccel_sb3.collection import lean_sample_action_for

    if not isinstance(model, OffPolicyAlgorithm):
        return {}
    methods = {}
    sample_action = lean_sample_action_for(model)
    if sample_action is not None:
        methods["_sample_action"] = sample_action
    store = _lean_store_transition(model)
    if store is not None:
        methods["_store_transition"] = store
    on_step = _lean_target_update_on_step(model)
    if on_step is not None:
        methods["_on_step"] = on_step
    if _runs_sb3s(model, "collect_rollouts", *_INLINED):
        methods["collect_rollouts"] = functools.partial(collect_rollouts, model)
    return methods


def _runs_sb3s(model, *names: str) -> bool:
    return all(getattr(type(model), n) is getattr(OffPolicyAlgorithm, n) for n in names)


def collect_rollouts(self, env, callback, train_freq, replay_buffer, action_noise=None, learning_starts: int = 0,
                     log_interval: int | None = None):
    """SB3's ``OffPolicyAlgorithm.collect_rollouts``, line for line, with ``should_collect_more_steps``,
    ``_update_info_buffer`` and ``_update_current_progress_remaining`` inlined. Its local names are
    SB3's: callbacks see the same ``locals()`` (no import, helper or new name in here)."""
    # Switch to eval mode (this affects batch norm / dropout)
    set_training_mode(self.policy, False)  # the same flags, written flat (training_mode.py)

    num_collected_steps, num_collected_episodes = 0, 0

    assert isinstance(env, VecEnv), "You must pass a VecEnv"
    assert train_freq.frequency > 0, "Should at least collect one step or episode."

    if env.num_envs > 1:
        assert train_freq.unit == TrainFrequencyUnit.STEP, "You must use only one env when doing episodic training."

    if self.use_sde:
        self.actor.reset_noise(env.num_envs)  # type: ignore[operator]

    callback.on_rollout_start()
    continue_training = True
    while (num_collected_steps if train_freq.unit == TrainFrequencyUnit.STEP
           else num_collected_episodes) < train_freq.frequency:
        if self.use_sde and self.sde_sample_freq > 0 and num_collected_steps % self.sde_sample_freq == 0:
            # Sample a new noise matrix
            self.actor.reset_noise(env.num_envs)  # type: ignore[operator]

        # Select action randomly or according to policy
        actions, buffer_actions = self._sample_action(learning_starts, action_noise, env.num_envs)

        # Rescale and perform action
        new_obs, rewards, dones, infos = env.step(actions)

        self.num_timesteps += env.num_envs
        num_collected_steps += 1

        # Give access to local variables
        callback.update_locals(locals())
        # Only stop training if return value is False, not when it is None.
        if not callback.on_step():
            return RolloutReturn(num_collected_steps * env.num_envs, num_collected_episodes, continue_training=False)

        # Retrieve reward and episode length if using Monitor wrapper (SB3's _update_info_buffer). The loop
        # reuses the names idx/done so that locals() holds only SB3's names; the dones loop below rebinds
        # both before callbacks see them again
        for idx, done in enumerate(infos):
            if done.get("episode") is not None:
                self.ep_info_buffer.extend([done["episode"]])
            if done.get("is_success") is not None and dones[idx]:
                self.ep_success_buffer.append(done["is_success"])

        # Store data in replay buffer (normalized action and unnormalized observation)
        self._store_transition(replay_buffer, buffer_actions, new_obs, rewards, dones, infos)  # type: ignore[arg-type]

        self._current_progress_remaining = 1.0 - float(self.num_timesteps) / float(self._total_timesteps)

        # For DQN, check if the target network should be updated
        # and update the exploration schedule
        # For SAC/TD3, the update is dones as the same time as the gradient update
        # see https://github.com/hill-a/stable-baselines/issues/900
        self._on_step()

        for idx, done in enumerate(dones):
            if done:
                # Update stats
                num_collected_episodes += 1
                self._episode_num += 1

                if action_noise is not None:
                    kwargs = dict(indices=[idx]) if env.num_envs > 1 else {}
                    action_noise.reset(**kwargs)

                # Log training infos
                if log_interval is not None and self._episode_num % log_interval == 0:
                    self.dump_logs()
    callback.on_rollout_end()

    return RolloutReturn(num_collected_steps * env.num_envs, num_collected_episodes, continue_training)


def _lean_store_transition(model) -> Callable | None:
    """SB3's ``_store_transition`` without the ``deepcopy`` of each observation, where the buffer copies
    what it stores (SB3's ``ReplayBuffer.add``, rlaccel's ``TieredReplayBuffer.add``) and there is no
    VecNormalize; None elsewhere."""
    from stable_baselines3.common.buffers import ReplayBuffer

    from rlaccel_sb3.buffers import TieredReplayBuffer

    buffer = getattr(model, "replay_buffer", None)
    if type(model)._store_transition is not OffPolicyAlgorithm._store_transition \
            or type(buffer).add not in (ReplayBuffer.add, TieredReplayBuffer.add):
        return None
    sb3_store = type(model)._store_transition.__get__(model)
    direct_add = _direct_add(buffer)

    def _store_transition(replay_buffer, buffer_action, new_obs, reward, dones, infos) -> None:
        if model._vec_normalize_env is not None or type(new_obs) is not np.ndarray or new_obs.dtype == object \
                or replay_buffer is not buffer:
            return sb3_store(replay_buffer, buffer_action, new_obs, reward, dones, infos)
        model._last_original_obs = model._last_obs
        next_obs = new_obs
        for i, done in enumerate(dones):
            if done and infos[i].get("terminal_observation") is not None:
                if next_obs is new_obs:  # copied only to replace a row
                    next_obs = deepcopy(new_obs)
                next_obs[i] = infos[i]["terminal_observation"]
        (direct_add or replay_buffer.add)(model._last_original_obs, next_obs, buffer_action, reward, dones, infos)
        model._last_obs = new_obs

    return _store_transition


def _direct_add(buffer) -> Callable | None:
    """SB3's own ``ReplayBuffer.add`` as the array assignments it makes, without its ``np.array`` copy of
    each argument (the assignment into the buffer's arrays copies, casting alike). For SB3's
    ``ReplayBuffer.add`` itself (not a subclass's or an instance's own), Box observations and without
    ``optimize_memory_usage``; None elsewhere."""
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    if type(buffer).add is not ReplayBuffer.add or "add" in vars(buffer) or buffer.optimize_memory_usage \
            or isinstance(buffer.observation_space, spaces.Discrete):
        return None
    action_shape = (buffer.n_envs, buffer.action_dim)

    def add(obs, next_obs, action, reward, done, infos) -> None:
        pos = buffer.pos
        buffer.observations[pos] = obs
        buffer.next_observations[pos] = next_obs
        buffer.actions[pos] = action.reshape(action_shape)
        buffer.rewards[pos] = reward
        buffer.dones[pos] = done
        if buffer.handle_timeout_termination:
            buffer.timeouts[pos] = [info.get("TimeLimit.truncated", False) for info in infos]
        buffer.pos = pos + 1
        if buffer.pos == buffer.buffer_size:
            buffer.full = True
            buffer.pos = 0

    return add


def _lean_target_update_on_step(model) -> Callable | None:
    """DQN / QR-DQN's ``_on_step`` with the Polyak update on parameter lists made once (SB3 lists both
    networks' parameters on every update) in multi-tensor kernels of the same arithmetic; None for other
    algorithms (SAC/TD3/DDPG update their targets in ``train()``) and where a lazy layer has no weights yet."""
    from rlaccel_plugins.fused import polyak_update_
    from rlaccel_plugins.fused.module_cache import has_uninitialized
    from rlaccel_sb3.fused.registry import q_learning_classes

    entry = next((a for cls, a in q_learning_classes() if type(model)._on_step is cls._on_step), None)
    if entry is None or entry.q_networks is None:
        return None
    online, target = (getattr(model, name) for name in entry.q_networks)
    if has_uninitialized(online, target):
        return None  # a lazy layer not created yet: SB3's own update (its .data of one is empty)
    params, target_params = list(online.parameters()), list(target.parameters())
    norm_stats = bool(model.batch_norm_stats)  # SB3's call with two empty lists does nothing

    def _on_step() -> None:
        model._n_calls += 1
        # Account for multiple environments: each call to step() corresponds to n_envs transitions
        if model._n_calls % max(model.target_update_interval // model.n_envs, 1) == 0:
            polyak_update_(params, target_params, model.tau)
            if norm_stats:  # running stats, SB3 GH #996
                polyak_update_(model.batch_norm_stats, model.batch_norm_stats_target, 1.0)
        model.exploration_rate = model.exploration_schedule(model._current_progress_remaining)
        model.logger.record("rollout/exploration_rate", model.exploration_rate)

    return _on_step
