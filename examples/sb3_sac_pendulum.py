"""SB3 SAC on Pendulum-v1 with the tiered buffer (RL Zoo's settings otherwise).

    python examples/sb3_sac_pendulum.py [--steps 20000] [--seed 0]
"""

from __future__ import annotations

import argparse

from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
from stable_baselines3 import SAC
from stable_baselines3.common.evaluation import evaluate_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=args.seed,
                replay_buffer_class=TieredReplayBuffer,
                replay_buffer_kwargs=dict(level_capacity=[20_000, 180_000], sampling_ratio=[0.3, 0.7]))
    callback = AccelerateCallback(sparse=False)  # metrics only: SAC's 3-layer MLPs gain nothing from sparse steps
    model.learn(args.steps, callback=callback)
    mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=10)
    print(f"Pendulum-v1 SAC + tiered replay: {args.steps} steps, evaluation {mean:.1f} ± {std:.1f}")


if __name__ == "__main__":
    main()
