"""Minor page faults and ms per gradient step of SB3's QR-DQN ``train()`` and the fused one, in one
process, as ``fused_bench.py`` runs them (two models, calls alternating).

QR-DQN's quantile Huber loss makes batch x 200 x 200 temporaries (10 MB at batch 64) on every step.
Whether glibc serves them from heap memory it already holds, or trims the heap after each step and
page-faults it back in on the next, depends on where longer-lived allocations happen to sit in the
heap: the process's history, not the code path's arithmetic. This script shows which path pays in
a process that holds both models, and with ``--only`` in a process of its own.

Usage:
    python -m benchmarks.investigations.page_faults [--rounds 4] [--steps 64] [--only stock|fused]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from benchmarks.fused_bench import build


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=64, help="gradient steps per train() call")
    parser.add_argument("--only", choices=("stock", "fused"), help="one model in this process, not both")
    args = parser.parse_args()
    from rlaccel_sb3 import fused as fused_module

    train = {}
    if args.only != "fused":
        train["stock"] = build("qrdqn", (64, 64)).train
    if args.only != "stock":
        train["fused"] = fused_module.fused_train_for(build("qrdqn", (64, 64)))
    for run in train.values():
        run(2, 64)  # warm-up
    ms, per_step = {name: [] for name in train}, {name: [] for name in train}
    for r in range(args.rounds):
        for name in list(train) if r % 2 == 0 else list(train)[::-1]:
            before, start = faults(), time.perf_counter()
            train[name](args.steps, 64)
            ms[name].append(1e3 * (time.perf_counter() - start) / args.steps)
            per_step[name].append((faults() - before) / args.steps)
    print(f"SB3 QR-DQN 64-64, batch 64, {args.steps} steps per call, {args.rounds} rounds"
          + (f", {args.only} alone in its process" if args.only else "") + "; medians")
    for name in train:
        print(f"  {name:<6} {statistics.median(ms[name]):7.2f} ms/step  "
              f"{statistics.median(per_step[name]):8.0f} minor page faults/step")


if __name__ == "__main__":
    main()
