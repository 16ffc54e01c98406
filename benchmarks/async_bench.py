"""Does asynchronous collection pay? SB3 DQN, sync `learn()` vs `learn_async()`, same run.

Wall time for a fixed number of env steps (same settings, same replay ratio), interleaved rounds.

Usage:
    python benchmarks/async_bench.py [--env CartPole-v1] [--steps 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from stable_baselines3 import DQN

from rlaccel_sb3.async_learn import learn_async
from rlaccel_sb3.train import zoo_settings


def run(env_id: str, steps: int, asynchronous: bool) -> float:
    kwargs = zoo_settings("dqn", env_id)
    kwargs.pop("n_timesteps", None)
    model = DQN("MlpPolicy", env_id, seed=0, **kwargs)
    start = time.perf_counter()
    if asynchronous:
        learn_async(model, steps)
    else:
        model.learn(steps)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times = {"sync": [], "async": []}
    for _ in range(args.rounds):
        times["sync"].append(run(args.env, args.steps, False))
        times["async"].append(run(args.env, args.steps, True))
    sync, asyn = np.median(times["sync"]), np.median(times["async"])
    print(f"{args.env} DQN (RL Zoo settings), {args.steps} env steps, median of {args.rounds} rounds: "
          f"sync {sync:.1f} s, async {asyn:.1f} s -> async is {sync / asyn:.2f}x the speed of sync")


if __name__ == "__main__":
    main()
