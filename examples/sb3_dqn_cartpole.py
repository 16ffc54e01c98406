"""SB3 DQN on CartPole-v1 with rlaccel: RL Zoo's settings, the tiered buffer, the callback.

    python examples/sb3_dqn_cartpole.py [--steps 50000] [--seed 0]

The rlaccel lines are marked; remove them and this is RL Zoo's DQN CartPole run. What they change:
the replay buffer (tiered storage: the 5,000 newest transitions and the rest of the 100,000 as two levels,
reported in the metrics; batches drawn uniformly from all of them, as SB3 draws, since the preset samples
uniformly), the fused update and the callback's metrics. What they do not change: RL Zoo's batch size, learning rate and update
cadence (the preset's own, which `rlaccel train` uses, apply only where rlaccel builds the agent),
and every update stays full (the preset turns sparse/dense off: it saves nothing on this MLP).
"""

from __future__ import annotations

import argparse

from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
from stable_baselines3 import DQN
from stable_baselines3.common.evaluation import evaluate_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
                replay_buffer_class=TieredReplayBuffer,                                  # rlaccel
                replay_buffer_kwargs=dict(preset="classic_control"),                    # rlaccel
                seed=args.seed, verbose=0)
    callback = AccelerateCallback(preset="classic_control")                           # rlaccel
    model.learn(args.steps, callback=callback)
    mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=10)
    print(f"CartPole-v1 DQN + rlaccel: {args.steps} steps, evaluation {mean:.1f} ± {std:.1f}; "
          f"levels {model.replay_buffer.engine.level_sizes}; updates {callback.stats}")


if __name__ == "__main__":
    main()
