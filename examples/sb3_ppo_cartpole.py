"""SB3 PPO on CartPole-v1 (RL Zoo's settings) with the sparse/dense callback.

    python examples/sb3_ppo_cartpole.py [--steps 100000] [--seed 0]

PPO has no replay buffer; the callback trains the two heads (action, value and their last hidden
layers) on every minibatch step and the whole network every `sparse_update_interval` steps.
"""

from __future__ import annotations

import argparse

from rlaccel_sb3 import SparseDenseCallback
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy


def linear(start: float):
    return lambda progress: progress * start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=args.seed)
    callback = SparseDenseCallback(sparse_update_interval=10, dense_layers=[-2, -1], verbose=1)
    model.learn(args.steps, callback=callback)
    mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=10)
    print(f"CartPole-v1 PPO + sparse/dense: {args.steps} steps, evaluation {mean:.1f} ± {std:.1f}; "
          f"updates {callback.stats['full_updates']} full / {callback.stats['dense_updates']} dense")


if __name__ == "__main__":
    main()
