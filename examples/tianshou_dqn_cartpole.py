"""Tianshou DQN on CartPole-v1 with rlaccel's tiered vector buffer, trained to the 475 threshold.

    python examples/tianshou_dqn_cartpole.py [--steps 100000] [--seed 0] [--stop-at 475] [--epoch-steps 10000]

The rlaccel lines are marked; with `VectorReplayBuffer(50_000, 10)` and `Collector` there it is a plain
Tianshou run.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from rlaccel_tianshou import LeanCollector, TieredVectorReplayBuffer
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net

NUM_ENVS, EPOCH_STEPS = 10, 10_000


def train(seed: int = 0, max_steps: int = 100_000, stop_at: float = 475.0,
          epoch_steps: int = EPOCH_STEPS) -> tuple[float, int, float]:
    """Train until a 10-episode test mean (run every ``epoch_steps``) reaches ``stop_at`` or ``max_steps``;
    returns (best, env steps, seconds)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    training_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(NUM_ENVS)])
    test_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(NUM_ENVS)])
    training_envs.seed(seed)
    test_envs.seed(seed + 100)
    net = Net(state_shape=4, action_shape=2, hidden_sizes=[256, 256])
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(2), eps_training=1.0)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.99, n_step_return_horizon=3,
                    target_update_freq=500)
    buffer = TieredVectorReplayBuffer(50_000, NUM_ENVS, preset="classic_control")          # rlaccel
    training_collector = LeanCollector(algorithm, training_envs, buffer, exploration_noise=True)  # rlaccel
    test_collector = Collector(algorithm, test_envs)
    training_collector.reset()
    training_collector.collect(n_step=1000, random=True)

    def training_fn(epoch: int, env_step: int) -> None:
        policy.set_eps_training(max(0.04, 1.0 - env_step / 16_000))

    start = time.perf_counter()
    result = algorithm.run_training(OffPolicyTrainerParams(
        training_collector=training_collector, test_collector=test_collector,
        max_epochs=max(1, max_steps // epoch_steps), epoch_num_steps=min(epoch_steps, max_steps),
        collection_step_num_env_steps=10,
        test_step_num_episodes=10, batch_size=64, update_step_num_gradient_steps_per_sample=0.5,
        training_fn=training_fn, stop_fn=lambda mean_reward: mean_reward >= stop_at, show_progress=False, verbose=False))
    return float(result.best_reward), int(training_collector.collect_step), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-at", type=float, default=475.0, help="the test mean that ends training")
    parser.add_argument("--epoch-steps", type=int, default=EPOCH_STEPS, help="env steps between test runs")
    args = parser.parse_args()
    best, steps, seconds = train(args.seed, args.steps, args.stop_at, args.epoch_steps)
    print(f"CartPole-v1 Tianshou DQN + tiered replay: best test mean {best:.1f} after {steps} env steps, {seconds:.1f} s")


if __name__ == "__main__":
    main()
