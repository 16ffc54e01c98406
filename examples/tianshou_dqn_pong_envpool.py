"""Tianshou DQN on Atari Pong: envpool envs, the `atari` preset's tiers and the wrapper's fused updates (every
update full: the pixel study measured the article's sparse/dense schedule to learn less).

    python examples/tianshou_dqn_pong_envpool.py [--steps 1000000] [--envs 8]

Tianshou's own Atari example settings otherwise (lr 1e-4, n-step 3, target update 500, batch 32,
stack 4 with `save_only_last_obs`). The full run is a GPU job; on a CPU use --steps for a look.
"""

from __future__ import annotations

import argparse

import envpool
import numpy as np
import torch
from rlaccel_tianshou import SparseDenseWrapper, TieredVectorReplayBuffer
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector
from tianshou.env.atari.atari_network import DQNet
from tianshou.trainer import OffPolicyTrainerParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    envs = envpool.make_gymnasium("Pong-v5", num_envs=args.envs, seed=args.seed, episodic_life=True, reward_clip=True)
    obs_shape = envs.observation_space.shape
    net = DQNet(c=obs_shape[0], h=obs_shape[1], w=obs_shape[2], action_shape=envs.action_space.n)
    policy = DiscreteQLearningPolicy(model=net, action_space=envs.action_space, eps_training=1.0, eps_inference=0.005)
    algorithm = SparseDenseWrapper(DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-4), gamma=0.99,
                                       n_step_return_horizon=3, target_update_freq=500), preset="atari")
    # env-side stacks of 4: store only the newest frame, rebuild stacks of 4 on sampling
    buffer = TieredVectorReplayBuffer(126_000, args.envs, preset="atari", ignore_obs_next=True, save_only_last_obs=True,
                                      stack_num=4)
    collector = Collector(algorithm, envs, buffer, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=32 * args.envs, random=True)

    def training_fn(epoch: int, env_step: int) -> None:
        policy.set_eps_training(float(np.interp(env_step, [0, 1_000_000], [1.0, 0.05])))

    epoch_steps = min(args.steps, 100_000)
    algorithm.run_training(OffPolicyTrainerParams(
        training_collector=collector, test_collector=None, max_epochs=max(1, args.steps // epoch_steps),
        epoch_num_steps=epoch_steps, collection_step_num_env_steps=10, batch_size=32,
        update_step_num_gradient_steps_per_sample=0.1, training_fn=training_fn, show_progress=False, verbose=False))
    print(f"Pong: {collector.collect_step} env steps; levels {buffer.stats()}; updates {algorithm.updater.stats}")


if __name__ == "__main__":
    main()
