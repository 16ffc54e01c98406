"""Denormals in Adam's state late in a run, what they cost, and what flushing them would give.

1. **Census**: RL Zoo's CartPole DQN (the SB3 drop-in and stock) after ``--steps`` env steps: the share of
   Adam's ``exp_avg`` / ``exp_avg_sq`` elements that are exactly zero and that are float32 denormals.
2. **Ops**: ``lerp_``, ``mul_``, ``sqrt`` on 67,586 floats (the 256-256 Q-network's size) holding normal
   values, denormals or zeros (µs per op).
3. **Flush A/B**: two drop-in models from the same seed learn ``--steps`` env steps, then take turns
   for ``--segments`` segments of 2,048 env steps, one with ``torch.set_flush_denormal(True)`` around
   its ``learn()`` calls, at 1 and at 2 torch threads (the flush is set per thread: the intra-op pool's
   other thread keeps computing on denormals); printed: the flushed run's time over the other's, and
   whether their weights are still bit-identical.

Usage:
    python -m benchmarks.investigations.denormal_bench [--steps 12000] [--segments 6] [--parts census,ops,flush]
"""

from __future__ import annotations

import argparse
import time

import torch
from dropin_learn import Run


def census(steps: int) -> None:
    tiny = torch.finfo(torch.float32).tiny
    for variant in ("stock", "drop-in"):
        run = Run("dqn-cartpole", variant)
        run.learn(steps)
        optimizer = run.model.policy.optimizer
        for key in ("exp_avg", "exp_avg_sq"):
            values = torch.cat([optimizer.state[p][key].flatten() for g in optimizer.param_groups for p in g["params"]])
            zero = (values == 0).float().mean().item()
            denormal = ((values != 0) & (values.abs() < tiny)).float().mean().item()
            print(f"  {variant:<8} {key:<10} after {steps:,} env steps: zero {zero:.1%}, denormal {denormal:.1%}")


def _us(f, reps: int = 500) -> float:
    f()
    start = time.perf_counter()
    for _ in range(reps):
        f()
    return 1e6 * (time.perf_counter() - start) / reps


def _op_times(scale: float, n: int) -> tuple[float, float, float]:
    """µs of ``lerp_``, ``mul_`` and ``sqrt`` over ``n`` floats of magnitude ``scale``."""
    a0, b, c = torch.randn(n) * scale, torch.randn(n) * scale, torch.rand(n) * scale
    a, out = a0.clone(), torch.empty(n)
    copy = _us(lambda: a.copy_(a0))  # the in-place ops start from the same values each time
    return (_us(lambda: (a.copy_(a0), a.lerp_(b, 0.1))) - copy, _us(lambda: (a.copy_(a0), a.mul_(0.999))) - copy,
            _us(lambda: torch.sqrt(c, out=out)))


def ops() -> None:
    n = 67_586
    for name, scale in (("normal", 1.0), ("denormal", 1e-39), ("zero", 0.0)):
        lerp, mul, sqrt = _op_times(scale, n)
        print(f"  {name:<8} lerp_ {lerp:7.1f}  mul_ {mul:7.1f}  sqrt {sqrt:7.1f}  (µs, {n:,} floats)")


def _flush_at(threads: int, steps: int, segments: int) -> None:
    torch.set_num_threads(threads)
    runs = {"plain": Run("dqn-cartpole", "drop-in"), "flushed": Run("dqn-cartpole", "drop-in")}

    def learn(name: str, n: int) -> float:
        torch.set_flush_denormal(name == "flushed")
        try:
            return runs[name].learn(n)
        finally:
            torch.set_flush_denormal(False)

    for name in runs:
        learn(name, steps)
    total = dict.fromkeys(runs, 0.0)
    for i in range(segments):
        for name in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            total[name] += learn(name, 2048)
    same = all(torch.equal(p, q) for p, q in zip(runs["plain"].model.policy.parameters(),
                                                  runs["flushed"].model.policy.parameters()))
    print(f"  {threads} torch thread(s): flushed / plain time {total['flushed'] / total['plain']:.3f} "
          f"({total['flushed']:.1f} s / {total['plain']:.1f} s); weights bit-identical: {same}", flush=True)


def flush(steps: int, segments: int) -> None:
    threads = torch.get_num_threads()
    for n in (1, 2):
        _flush_at(n, steps, segments)
    torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12_000)
    parser.add_argument("--segments", type=int, default=6)
    parser.add_argument("--parts", default="census,ops,flush")
    args = parser.parse_args()
    parts = args.parts.split(",")
    threads = torch.get_num_threads()
    if "census" in parts:
        print("Adam's state in RL Zoo's CartPole DQN")
        census(args.steps)
    if "ops" in parts:
        print(f"elementwise ops, {threads} torch threads")
        ops()
    if "flush" in parts:
        print(f"the drop-in with and without torch.set_flush_denormal(True) around learn(), after {args.steps:,} "
              f"env steps, {args.segments} interleaved segments of 2,048")
        flush(args.steps, args.segments)


if __name__ == "__main__":
    main()
