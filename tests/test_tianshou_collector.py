"""`LeanCollector` collects what Tianshou's `Collector` collects, step by step (DESIGN.md §10): the same
algorithm, seeds and envs through both — every stored transition, the collect statistics and numpy's
RNG (exploration draws) compared. Tolerance: none (bit-identical)."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.utils.net.common import Net

from rlaccel_plugins.fused import differences

FIELDS = ("obs", "act", "rew", "terminated", "truncated", "done", "obs_next")


def _dqn() -> DQN:
    torch.manual_seed(0)
    policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[64, 64]),
                                     action_space=gym.spaces.Discrete(2), eps_training=0.2)
    return DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3)


def _collect(collector_class, dqn: DQN, steps: int, exploration: bool = True) -> dict:
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)])
    envs.seed(5)
    buffer = VectorReplayBuffer(4_000, 4)
    collector = collector_class(dqn, envs, buffer, exploration_noise=exploration)
    np.random.seed(9)
    collector.reset()
    stats = [collector.collect(n_step=100, random=True)]
    with torch.no_grad():
        dqn.policy.is_within_training_step = True  # the training eps, as in a trainer's collection
        for _ in range(steps // 200):
            stats.append(collector.collect(n_step=200))
        dqn.policy.is_within_training_step = False
    stats.append(collector.collect(n_episode=8))  # greedy (eps_inference 0), whole episodes
    return {"buffer": {f: getattr(buffer, f)[: len(buffer)].copy() for f in FIELDS},
            "returns": [s.returns for s in stats], "lens": [s.lens for s in stats],
            "steps": [s.n_collected_steps for s in stats], "rng": np.random.get_state()[1].copy()}


@pytest.mark.parametrize("exploration", [True, False])
def test_lean_collector_collects_what_tianshous_collector_collects(exploration):
    from rlaccel_tianshou import LeanCollector

    dqn = _dqn()
    stock = _collect(Collector, copy.deepcopy(dqn), 2_000, exploration)
    lean = _collect(LeanCollector, copy.deepcopy(dqn), 2_000, exploration)
    assert sum(stock["steps"]) >= 2_100 and len(stock["buffer"]["obs"]) > 2_000
    assert differences(stock, lean) == []


def test_a_changed_action_breaks_the_collector_equivalence(monkeypatch):
    from rlaccel_tianshou import LeanCollector
    from rlaccel_tianshou import collector as module

    monkeypatch.setattr(module, "to_numpy", lambda t: 1 - t.cpu().numpy())  # the argmax flipped
    dqn = _dqn()
    assert differences(_collect(Collector, copy.deepcopy(dqn), 400), _collect(LeanCollector, copy.deepcopy(dqn), 400))


def test_other_policies_collect_through_tianshous_own_step():
    from rlaccel_tianshou import LeanCollector
    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory as Adam
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    net = Net(state_shape=4, hidden_sizes=[16])
    actor, critic = DiscreteActor(preprocess_net=net, action_shape=2), DiscreteCritic(preprocess_net=net)
    policy = DiscreteActorPolicy(actor=actor, dist_fn=torch.distributions.Categorical,
                                 action_space=gym.spaces.Discrete(2))
    ppo = PPO(policy=policy, critic=critic, optim=Adam())
    collector = LeanCollector(ppo, DummyVectorEnv([lambda: gym.make("CartPole-v1")]), VectorReplayBuffer(100, 1))
    _ = collector.reset()
    assert not collector.lean and collector.collect(n_step=20).n_collected_steps == 20
