"""The SB3 DQN drop-in with the ``off`` preset (one uniform level: SB3's sampling distribution from
another random stream; fused updates and lean collection) on one task of the ``classic`` suite, seed
by seed, as ``rlaccel bench --suite classic --frameworks sb3`` runs its variants (a fresh process per
run). Env steps to threshold are reproducible per seed, so they compare with the suite's own per-seed
records: does the tiered preset's recency cost env steps, or is it the random stream?

Usage:
    python -m benchmarks.investigations.dropin_off_seeds --env Acrobot-v1 --seeds 5 --steps 60000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

from rlaccel_plugins.bench.runner import run_isolated
from rlaccel_plugins.bench.suites import drop_in, get_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Acrobot-v1")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60_000, help="env-step cap, as the suite's --steps")
    args = parser.parse_args()
    task = next(t for t in get_suite("classic", frameworks=("sb3",)) if t.env_id == args.env)
    task = dataclasses.replace(task, steps=args.steps)
    steps = []
    for seed in range(args.seeds):
        record = run_isolated(task, drop_in("sb3", "off"), seed)
        steps.append(record["steps_to_threshold"])
        print(json.dumps({k: record[k] for k in ("variant", "seed", "seconds_to_threshold", "steps_to_threshold",
                                                 "env_steps_per_s", "final_eval")}), flush=True)
    reached = [s for s in steps if s is not None]
    print(f"reached {len(reached)}/{len(steps)}; median env steps to threshold "
          f"{statistics.median(reached) if reached else None}")


if __name__ == "__main__":
    main()
