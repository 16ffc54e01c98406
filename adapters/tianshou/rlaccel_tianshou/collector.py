"""`LeanCollector`: Tianshou's ``Collector`` with the same signature, transitions, statistics and random
draws, and a leaner action step.

Measured (``python benchmarks/collect_bench.py --framework``), a Tianshou collector step of the CartPole DQN
example costs ~84 µs per env step against ~25 µs for the env step plus the Q-network's forward. A
quarter of that is the action step: Tianshou wraps every vector step's infos into a ``Batch`` for the
policy (``_HACKY_create_info_batch``), builds the policy's input and output ``Batch``es, and runs the
forward with autograd recording. For a ``DiscreteQLearningPolicy`` (DQN) on a Tianshou ``Net`` — whose
forward does not read the infos — on array observations without an action mask, :class:`LeanCollector`
computes the same greedy actions from the same network without those ``Batch``es and under
``torch.no_grad``, and leaves exploration to the policy's own ``add_exploration_noise`` (the same numpy
draws). Every other step of the collection is Tianshou's own. Equivalence is tested step by step in
``tests/test_tianshou_collector.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from tianshou.data import Batch, Collector
from tianshou.data.utils.converter import to_numpy


class LeanCollector(Collector):
    """Drop-in for ``tianshou.data.Collector`` (same arguments): the DQN action step made lean, the rest
    Tianshou's own. Other policies collect exactly as with ``Collector``.

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

        return type(self.policy) is DiscreteQLearningPolicy and type(self.policy.model) is Net

    def _compute_action_policy_hidden(self, random: bool, ready_env_ids_R: np.ndarray, last_obs_RO: np.ndarray,
                                      last_info_R: np.ndarray, last_hidden_state_RH: Any = None):
        if random or last_hidden_state_RH is not None or type(last_obs_RO) is not np.ndarray or not self.lean:
            return super()._compute_action_policy_hidden(random, ready_env_ids_R, last_obs_RO, last_info_R,
                                                         last_hidden_state_RH)
        policy = self.policy
        with torch.no_grad():  # the same ops; Tianshou records autograd here, nothing reads it
            action_values_BA, _ = policy.model(last_obs_RO)
        act_RA = to_numpy(action_values_BA.argmax(dim=1))  # DQN.forward without a mask: compute_q_value is the identity
        if self.exploration_noise:
            act_RA = policy.add_exploration_noise(act_RA, SimpleNamespace(obs=last_obs_RO))  # reads obs (mask) only
        return Batch(act=act_RA, act_normalized=policy.map_action(act_RA), policy_entry=Batch(), dist=None,
                     hidden_state=None)
