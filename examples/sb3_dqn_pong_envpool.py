"""SB3 DQN on Atari Pong, envpool for the envs and the `atari` preset (the article's Pong settings, every update
full: the pixel study measured its sparse/dense schedule to learn less) for replay and updates.

    python examples/sb3_dqn_pong_envpool.py [--steps 10000000] [--envs 8] [--logdir runs/pong]

RL Zoo's Atari DQN settings (batch 32, lr 1e-4, one gradient step per 4 env steps per env, ...)
are kept: `accelerate` reports where the preset differs (batch 512, lr 2.5e-4, 256 envs) but never
changes a model's hyper-parameters. The full run is a GPU job; on a CPU use --steps for a look.
"""

from __future__ import annotations

import argparse

from rlaccel_sb3 import AccelerateCallback, EnvPoolVecEnv, TieredReplayBuffer
from stable_baselines3 import DQN
from stable_baselines3.common.vec_env import VecMonitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-starts", type=int, default=100_000)
    parser.add_argument("--logdir", default=None, help="TensorBoard directory")
    args = parser.parse_args()

    env = VecMonitor(EnvPoolVecEnv("Pong-v5", num_envs=args.envs, seed=args.seed, sb3_atari=True))
    model = DQN("CnnPolicy", env, buffer_size=100_000, learning_rate=1e-4, batch_size=32,
                learning_starts=args.learning_starts, target_update_interval=1000, train_freq=4, gradient_steps=1,
                exploration_fraction=0.1, exploration_final_eps=0.01,
                replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="atari"),
                tensorboard_log=args.logdir, seed=args.seed, verbose=1)
    callback = AccelerateCallback(preset="atari", verbose=1)
    model.learn(args.steps, callback=callback, log_interval=10)
    engine = model.replay_buffer.engine
    print(f"Pong: {model.num_timesteps} steps; {engine.nbytes / max(len(engine), 1):,.0f} bytes per stored "
          f"transition; updates {callback.stats}")


if __name__ == "__main__":
    main()
