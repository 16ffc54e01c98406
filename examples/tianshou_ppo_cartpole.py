"""Tianshou PPO on CartPole-v1 with the sparse/dense on-policy wrapper.

    python examples/tianshou_ppo_cartpole.py [--steps 50000] [--seed 0]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import rlaccel_tianshou
import torch
from tianshou.algorithm import PPO
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OnPolicyTrainerParams
from tianshou.utils.net.common import Net
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(8)])
    test_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(8)])
    envs.seed(args.seed)
    test_envs.seed(args.seed + 100)
    actor = DiscreteActor(preprocess_net=Net(state_shape=4, hidden_sizes=[64, 64]), action_shape=2)
    critic = DiscreteCritic(preprocess_net=Net(state_shape=4, hidden_sizes=[64, 64]))
    policy = ProbabilisticActorPolicy(actor=actor, dist_fn=torch.distributions.Categorical,
                                      action_space=gym.spaces.Discrete(2), action_scaling=False)
    ppo = PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=3e-4), gamma=0.99)
    algorithm = rlaccel_tianshou.accelerate(ppo, sparse_update_interval=10, dense_layers=[-2, -1])  # rlaccel
    epoch_steps = min(args.steps, 10_000)
    result = algorithm.run_training(OnPolicyTrainerParams(
        training_collector=Collector(algorithm, envs, VectorReplayBuffer(2048, 8)),
        test_collector=Collector(algorithm, test_envs), max_epochs=max(1, args.steps // epoch_steps),
        epoch_num_steps=epoch_steps, collection_step_num_env_steps=2048, batch_size=256,
        update_step_num_repetitions=4, test_step_num_episodes=8, stop_fn=lambda r: r >= 475,
        show_progress=False, verbose=False))
    stats = algorithm.updater.stats
    print(f"CartPole-v1 Tianshou PPO + sparse/dense: best test mean {result.best_reward:.1f}; "
          f"{stats['full_updates']} full / {stats['dense_updates']} dense optimizer steps")


if __name__ == "__main__":
    main()
