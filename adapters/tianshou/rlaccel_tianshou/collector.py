"""`LeanCollector`: Tianshou's ``Collector`` with the same signature, transitions, statistics and random
draws, and a lean loop.

Tianshou's ``_collect`` builds, per vector step, a ``Batch`` of the step (stacking every env's info dict),
a copy of it for the buffer, which ``ReplayBufferManager.add`` copies once more and assigns key by key,
and at every episode's end fetches the episode back from the buffer as a ``Batch`` for the hooks and the
statistics, which read its length. Where no hook or custom statistics class reads them,
:meth:`LeanCollector._lean_collect` runs the same loop without them: the step goes straight into the
buffer's arrays (:mod:`rlaccel_tianshou.step_write`). For a ``DiscreteQLearningPolicy`` (DQN) on a
Tianshou ``Net`` — whose forward does not read the infos — on array observations without an action
mask, the action step is lean too: the same greedy actions from the same network (its flat layers)
under ``torch.no_grad``, without the info, input and output ``Batch``es, and exploration left to the
policy's own ``add_exploration_noise`` (the same numpy draws). Each ``collect()`` call switches the
policy to eval mode and back as Tianshou does, with the flags set on one list of modules instead of
``Module.train``'s two recursive walks. Equivalence is tested step by step in
``tests/tianshou/test_tianshou_collector.py``; ``python -m benchmarks.collect_bench --framework`` measures it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from copy import copy
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from tianshou.data import Batch, Collector, CollectStats
from tianshou.data.buffer.buffer_base import MalformedBufferError
from tianshou.data.collector import EpisodeRolloutHook, StepHook, _dict_of_arr_to_arr_of_dicts, _nullable_slice
from tianshou.data.stats import SequenceSummaryStats
from tianshou.data.utils.converter import to_numpy
from tianshou.utils.torch_utils import torch_train_mode

from rlaccel_plugins.fused.module_cache import cached, flags_set_mode
from rlaccel_tianshou import step_write

log = logging.getLogger("tianshou.data.collector")


def verified_collector() -> bool:
    """Whether Tianshou's collector code is what ``LeanCollector`` was verified against; where it is not,
    ``LeanCollector`` collects with Tianshou's own code (one warning says why)."""
    from rlaccel_plugins.fused.selection import select_fused
    from rlaccel_tianshou.verified import CODE

    return select_fused("auto", True, algorithm="Collector", framework="Tianshou", supported=["Collector"],
                        key="LeanCollector", what="collection", unverified=CODE.unverified("collector")) is not None


class LeanCollector(Collector):
    """Drop-in for ``tianshou.data.Collector`` (same arguments) that collects exactly what it collects: the
    loop lean where :attr:`lean_loop`, the action step too where :attr:`lean`.

    Examples:
        >>> import gymnasium as gym
        >>> from tianshou.algorithm import DQN
        >>> from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
        >>> from tianshou.algorithm.optim import AdamOptimizerFactory
        >>> from tianshou.data import VectorReplayBuffer
        >>> from tianshou.env import DummyVectorEnv
        >>> from tianshou.utils.net.common import Net
        >>> policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[16]),
        ...                                  action_space=gym.spaces.Discrete(2), eps_training=0.1)
        >>> dqn = DQN(policy=policy, optim=AdamOptimizerFactory())
        >>> envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
        >>> collector = LeanCollector(dqn, envs, VectorReplayBuffer(100, 2), exploration_noise=True)
        >>> _ = collector.reset()
        >>> collector.collect(n_step=10).n_collected_steps
        10
        >>> collector.lean
        True
    """

    @property
    def lean(self) -> bool:
        """Whether the action step runs lean for this collector's policy."""
        from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
        from tianshou.utils.net.common import Net

        return type(self.policy) is DiscreteQLearningPolicy and type(self.policy.model) is Net and verified_collector()

    def _q_network(self) -> Any:
        """The Q-network's forward on an observation array: the fused updates' flat ``Net`` (the same ops
        without the module calls; built once and kept while the network stays the same) where it
        applies, else the module."""
        from rlaccel_tianshou.flat_networks import first_parameter, forward_of

        net = self.policy.model
        flat = forward_of(net)
        if flat is net:
            return net
        device = first_parameter(net.model).device  # what MLP.forward reads (torch_device), once per collect
        return lambda obs: flat(torch.as_tensor(obs, device=device, dtype=torch.float32))

    def _lean_action(self, last_obs_RO: np.ndarray, q_network: Any) -> tuple[np.ndarray, np.ndarray]:
        policy = self.policy
        with torch.no_grad():  # the same ops; Tianshou records autograd here, nothing reads it
            action_values_BA, _ = q_network(last_obs_RO)
        act_RA = to_numpy(action_values_BA.argmax(dim=1))  # DQN.forward without a mask: compute_q_value is the identity
        if self.exploration_noise:
            eps = policy.eps_training if policy.is_within_training_step else policy.eps_inference
            # add_exploration_noise returns at once for np.isclose(eps, 0.0) (a slow call): the same test, inline
            if type(eps) not in (float, int) or not abs(eps) <= 1e-8:
                act_RA = policy.add_exploration_noise(act_RA, SimpleNamespace(obs=last_obs_RO))  # reads obs (mask)
        return act_RA, policy.map_action(act_RA)

    def _lean_action_applies(self, random: bool, last_obs_RO: Any, last_hidden_state_RH: Any) -> bool:
        return not random and last_hidden_state_RH is None and type(last_obs_RO) is np.ndarray and self.lean

    def _compute_action_policy_hidden(self, random: bool, ready_env_ids_R: np.ndarray, last_obs_RO: np.ndarray,
                                      last_info_R: np.ndarray, last_hidden_state_RH: Any = None):
        if not self._lean_action_applies(random, last_obs_RO, last_hidden_state_RH):
            return super()._compute_action_policy_hidden(random, ready_env_ids_R, last_obs_RO, last_info_R,
                                                         last_hidden_state_RH)
        act_RA, act_normalized_RA = self._lean_action(last_obs_RO, self.policy.model)
        return Batch(act=act_RA, act_normalized=act_normalized_RA, policy_entry=Batch(), dist=None,
                     hidden_state=None)

    @property
    def lean_loop(self) -> bool:
        """Whether :meth:`collect` runs the lean loop: no step or episode hooks, Tianshou's ``CollectStats``,
        a buffer :func:`~rlaccel_tianshou.step_write.add_step` writes, and no subclass override of the
        methods the loop calls."""
        cls = type(self)
        return (verified_collector() and self._on_step_hook is None and self._on_episode_done_hook is None
                and self.collect_stats_class is CollectStats and step_write.supports(self.buffer)
                and cls.run_on_step_hook is Collector.run_on_step_hook
                and cls.run_on_episode_done is Collector.run_on_episode_done
                and cls._compute_action_policy_hidden is LeanCollector._compute_action_policy_hidden
                and cls._reset_hidden_state_based_on_type is Collector._reset_hidden_state_based_on_type)

    def collect(self, n_step: int | None = None, n_episode: int | None = None, random: bool = False,
                render: float | None = None, reset_before_collect: bool = False,
                gym_reset_kwargs: dict[str, Any] | None = None) -> CollectStats:
        """Tianshou's ``BaseCollector.collect``, line for line, with its ``torch_train_mode(policy, False)``
        done flat where no module of the policy overrides ``train`` or ``__setattr__`` (:func:`_eval_mode`);
        Tianshou's own where its installed code is not the code this was verified against."""
        if not verified_collector():
            return super().collect(n_step=n_step, n_episode=n_episode, random=random, render=render,
                                   reset_before_collect=reset_before_collect, gym_reset_kwargs=gym_reset_kwargs)
        self._validate_n_step_n_episode(n_episode, n_step)
        if reset_before_collect:
            self.reset(reset_buffer=False, gym_reset_kwargs=gym_reset_kwargs)
        pre_collect_time = time.time()
        with _eval_mode(self.policy):
            collect_stats = self._collect(n_step=n_step, n_episode=n_episode, random=random, render=render,
                                          gym_reset_kwargs=gym_reset_kwargs)
        collect_time = time.time() - pre_collect_time
        collect_stats.set_collect_time(collect_time, update_collect_speed=True)
        _refresh_sequence_stats(collect_stats)
        if self.raise_on_nan_in_buffer and self.buffer.hasnull():
            nan_batch = self.buffer.isnull().apply_values_transform(np.sum)
            raise MalformedBufferError(
                "NaN detected in the buffer. You can drop them with `buffer.dropnull()`. "
                f"This error is most often caused by an incorrect use of {EpisodeRolloutHook.__name__}"
                "together with the `n_steps` (instead of `n_episodes`) option, or by "
                f"an incorrect implementation of {StepHook.__name__}."
                "Here an overview of the number of NaNs per field: \n"
                f"{nan_batch}",
            )
        return collect_stats

    def _collect(self, n_step: int | None = None, n_episode: int | None = None, random: bool = False,
                 render: float | None = None, gym_reset_kwargs: dict[str, Any] | None = None) -> CollectStats:
        if render or self.env.is_async or not self.lean_loop:
            return super()._collect(n_step=n_step, n_episode=n_episode, random=random, render=render,
                                    gym_reset_kwargs=gym_reset_kwargs)
        return self._lean_collect(n_step, n_episode, random, gym_reset_kwargs)

    def _lean_collect(self, n_step: int | None, n_episode: int | None, random: bool,
                      gym_reset_kwargs: dict[str, Any] | None) -> CollectStats:
        """Tianshou 2.0's ``Collector._collect``, step for step and with its names, less what only hooks,
        custom stats or rendering read: the step's ``Batch``, the episode ``Batch`` fetched back from the
        buffer at every episode end (its length is all ``CollectStats`` reads of it)."""
        if n_step is not None:
            ready_env_ids_R = np.arange(self.env_num)
        elif n_episode is not None:
            if self.env_num > n_episode:
                log.warning(f"Number of episodes ({n_episode}) is smaller than the number of environments "
                            f"({self.env_num}). This means that {self.env_num - n_episode} "
                            f"environments (or, equivalently, parallel workers) will not be used!")
            ready_env_ids_R = np.arange(min(self.env_num, n_episode))
        else:
            raise RuntimeError("Input validation failed, this is a bug and shouldn't have happened")
        if self._pre_collect_obs_RO is None or self._pre_collect_info_R is None:
            raise ValueError("Initial obs and info should not be None. Either reset the collector (using reset or "
                             "reset_env) or pass reset_before_collect=True to collect.")

        step_count = 0
        num_collected_episodes = 0
        collect_stats = CollectStats()
        last_obs_RO = _nullable_slice(self._pre_collect_obs_RO, ready_env_ids_R)
        last_info_R = _nullable_slice(self._pre_collect_info_R, ready_env_ids_R)
        last_hidden_state_RH = _nullable_slice(self._pre_collect_hidden_state_RH, ready_env_ids_R)
        buffer, q_network = self.buffer, None

        while True:
            if self._lean_action_applies(random, last_obs_RO, last_hidden_state_RH):
                if q_network is None:
                    q_network = self._q_network()
                act_RA, act_normalized_RA = self._lean_action(last_obs_RO, q_network)
                policy_R, dist_R, hidden_state_RH = _EMPTY, None, None
            else:
                action_batch_R = self._compute_action_policy_hidden(random, ready_env_ids_R, last_obs_RO,
                                                                    last_info_R, last_hidden_state_RH)
                act_RA, act_normalized_RA = action_batch_R.act, action_batch_R.act_normalized
                policy_R, dist_R = action_batch_R.policy_entry, action_batch_R.dist
                hidden_state_RH = action_batch_R.hidden_state

            obs_next_RO, rew_R, terminated_R, truncated_R, info_R = self.env.step(act_normalized_RA, ready_env_ids_R)
            if isinstance(info_R, dict):  # an envpool env's infos
                info_R = _dict_of_arr_to_arr_of_dicts(info_R)
            done_R = np.logical_or(terminated_R, truncated_R)

            if dist_R is None:  # CollectStats.update_at_step_batch reads the step's length and its dist
                collect_stats.n_collected_steps += len(ready_env_ids_R)
            else:
                collect_stats.update_at_step_batch(_StepForStats(dist_R, len(ready_env_ids_R)))
            num_episodes_done_this_iter = done_R.sum()
            num_collected_episodes += num_episodes_done_this_iter
            step_count += len(ready_env_ids_R)

            fields = dict(obs=last_obs_RO, act=act_RA, rew=rew_R, terminated=terminated_R, truncated=truncated_R,
                          done=done_R, obs_next=obs_next_RO)
            added = step_write.add_step(buffer, ready_env_ids_R, fields, info_R, policy_R)
            if added is None:
                policy_R = Batch() if policy_R is _EMPTY else policy_R  # the buffer may keep what it is given
                step_batch_R = Batch(obs=last_obs_RO, act=act_RA, policy=policy_R, obs_next=obs_next_RO, rew=rew_R,
                                     terminated=terminated_R, truncated=truncated_R, done=done_R, info=info_R)
                insertion_idx_R, ep_return_R, _, ep_start_idx_R = buffer.add(step_batch_R, buffer_ids=ready_env_ids_R)
            else:
                insertion_idx_R, ep_return_R, ep_start_idx_R = added

            last_obs_RO = copy(obs_next_RO)
            last_info_R = copy(info_R)
            last_hidden_state_RH = copy(hidden_state_RH)

            if num_episodes_done_this_iter > 0:
                env_done_local_idx_D = np.where(done_R)[0]
                gym_reset_kwargs = gym_reset_kwargs or {}
                env_done_global_idx_D = ready_env_ids_R[env_done_local_idx_D]
                obs_reset_DO, info_reset_D = self.env.reset(env_id=env_done_global_idx_D, **gym_reset_kwargs)
                self._reset_hidden_state_based_on_type(env_done_local_idx_D, last_hidden_state_RH)
                for local_done_idx in env_done_local_idx_D:
                    ep_start_idx = int(ep_start_idx_R[local_done_idx])
                    ep_stop_idx = int(insertion_idx_R[local_done_idx] + 1)
                    ep_index_array = buffer.get_buffer_indices(ep_start_idx, ep_stop_idx)
                    collect_stats.update_at_episode_done(episode_batch=range(len(ep_index_array)),
                                                         episode_return=ep_return_R[local_done_idx])
                last_obs_RO[env_done_local_idx_D] = obs_reset_DO
                last_info_R[env_done_local_idx_D] = info_reset_D

                if n_episode:  # Tianshou's step 13: surplus envs leave the collection
                    remaining_episodes_to_collect = n_episode - num_collected_episodes
                    surplus_env_num = len(ready_env_ids_R) - remaining_episodes_to_collect
                    if surplus_env_num > 0:
                        env_to_be_ignored_ind_local_S = env_done_local_idx_D[:surplus_env_num]
                        env_should_remain_R = np.ones_like(ready_env_ids_R, dtype=bool)
                        env_should_remain_R[env_to_be_ignored_ind_local_S] = False
                        ready_env_ids_R = ready_env_ids_R[env_should_remain_R]
                        last_obs_RO = last_obs_RO[env_should_remain_R]
                        last_info_R = last_info_R[env_should_remain_R]
                        if hidden_state_RH is not None:
                            last_hidden_state_RH = last_hidden_state_RH[env_should_remain_R]

            if (n_step and step_count >= n_step) or (n_episode and num_collected_episodes >= n_episode):
                break

        if self.raise_on_nan_in_buffer and buffer.hasnull():
            nan_batch = buffer.isnull().apply_values_transform(np.sum)
            raise MalformedBufferError(f"NaN detected in the buffer. You can drop them with `buffer.dropnull()`. "
                                       f"Here an overview of the number of NaNs per field: \n{nan_batch}")

        self.collect_step += step_count
        self.collect_episode += num_collected_episodes
        if n_step:
            self._pre_collect_obs_RO = last_obs_RO
            self._pre_collect_info_R = last_info_R
            self._pre_collect_hidden_state_RH = last_hidden_state_RH
        elif n_episode:
            self.reset_env(gym_reset_kwargs)
        return collect_stats


_EMPTY = Batch()  # the policy entry of a lean action step: nothing to store (add_step only reads its keys)


@contextlib.contextmanager
def _eval_mode(policy: torch.nn.Module):
    """``torch_train_mode(policy, enabled=False)``: every module in eval mode, then every module in the
    policy's mode from before (``Module.train`` sets the whole tree to one mode). ``Module.train`` walks
    the tree through ``children()`` and ``Module.__setattr__``, twice per ``collect()`` call; where no
    module overrides ``train`` the same flags are set on one list of the modules. A module that overrides ``train`` or ``__setattr__`` gets Tianshou's own switch."""
    modules, flat = cached(policy, "eval_mode", lambda: _modules_and_flat(policy))  # kept while the tree stays
    if not flat:
        with torch_train_mode(policy, enabled=False):
            yield
        return
    original_mode = policy.training
    try:
        for module in modules:
            module.__dict__["training"] = False  # what Module.train's `self.training = mode` stores
        yield
    finally:
        for module in modules:
            module.__dict__["training"] = original_mode


def _refresh_sequence_stats(stats: CollectStats) -> None:
    """``stats.refresh_all_sequence_stats()``. A call that saw one episode end (most of a trainer's short
    calls) gets its return's and length's summaries without numpy's four reductions each: numpy's
    mean, std, max and min of one finite value are the value, 0.0, the value and the value."""
    returns, lens = stats.returns, stats.lens
    if type(stats) is not CollectStats or returns.shape != (1,) or lens.shape != (1,) \
            or not math.isfinite(returns[0]) or stats.pred_dist_std_array is not None:
        stats.refresh_all_sequence_stats()
        return
    stats.returns_stat = SequenceSummaryStats(mean=float(returns[0]), std=0.0, max=float(returns[0]), min=float(returns[0]))
    stats.lens_stat = SequenceSummaryStats(mean=float(lens[0]), std=0.0, max=float(lens[0]), min=float(lens[0]))
    stats.pred_dist_std_array_stat = None


def _modules_and_flat(policy: torch.nn.Module) -> tuple[list[torch.nn.Module], bool]:
    modules = list(policy.modules())
    return modules, flags_set_mode(modules)


class _StepForStats:
    """What ``CollectStats.update_at_step_batch`` reads of a step: its length and the action distribution."""

    __slots__ = ("dist", "rows")

    def __init__(self, dist: Any, rows: int) -> None:
        self.dist, self.rows = dist, rows

    def __len__(self) -> int:
        return self.rows
