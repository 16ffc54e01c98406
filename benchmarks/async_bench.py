"""Does asynchronous collection pay? `rlaccel train` sync vs `--async`, same run, both frameworks.

Training wall time (evaluation excluded) for a fixed number of env steps with the same settings and
replay ratio (the preset's accelerated recipe), interleaved rounds.

Usage:
    python -m benchmarks.async_bench [--env CartPole-v1] [--steps 15000] [--rounds 2] [--frameworks sb3,tianshou]
        [--out benchmarks/results/async-bench]
"""

from __future__ import annotations

import argparse
import warnings
from functools import partial

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved, medians
from rlaccel_plugins.errors import RlaccelWarning
from rlaccel_plugins.loader import load_config
from rlaccel_plugins.training import TrainSpec, run_training


def run(framework: str, env_id: str, steps: int, asynchronous: bool, preset: str) -> float:
    spec = TrainSpec(framework=framework, algo="dqn", env_id=env_id, config=load_config(preset=preset), steps=steps,
                     eval_freq=steps, stop_at=float("inf"), progress=False, async_mode=asynchronous)
    return run_training(spec).train_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=15_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="classic_control")
    parser.add_argument("--frameworks", default="sb3,tianshou")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    warnings.simplefilter("ignore", RlaccelWarning)
    rows = []
    for framework in args.frameworks.split(","):
        times = interleaved({mode: partial(run, framework, args.env, args.steps, mode == "async", args.preset)
                             for mode in ("sync", "async")}, args.rounds, alternate=True)
        sync, asyn = medians(times).values()
        print(f"{framework} DQN {args.env} ({args.preset}), {args.steps} env steps, median of {args.rounds}: "
              f"sync {sync:.1f} s, async {asyn:.1f} s -> async runs at {sync / asyn:.2f}x the speed of sync",
              flush=True)
        rows.append({"framework": framework, "env": args.env, "preset": args.preset, "env_steps": args.steps,
                     "sync_s": sync, "async_s": asyn, "async_speed_vs_sync": sync / asyn})
    first = rows[0]
    label = {"sb3": "SB3", "tianshou": "Tianshou"}.get(first["framework"], first["framework"])
    _results.write(args.out, "async_bench", rows=rows,
                   headline=f"{label} DQN {first['env']}, async: {first['async_speed_vs_sync']:.2f}x sync's speed")


if __name__ == "__main__":
    main()
