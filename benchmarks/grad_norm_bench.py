"""The gradient norm and clip that the guard and the fused updates run per optimizer step: torch's
``get_total_norm`` / ``clip_grad_norm_`` against rlaccel's ``total_norm`` / ``clip_grad_norm`` (the same
ops and results, tested bit for bit; without torch's per-call grouping by device and dtype), µs per
call, minimum of 15 interleaved rounds, one torch thread, on the gradients of a SAC 256-256 critic, a
DQN 64-64 Q-network and SAC's entropy coefficient.

Usage:
    python -m benchmarks.grad_norm_bench [--rounds 15] [--number 500] [--out benchmarks/results/grad-norm-bench]
"""

from __future__ import annotations

import argparse
import timeit

import torch

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved
from rlaccel_plugins.fused.kernels import clip_grad_norm, total_norm

NETWORKS = {"SAC critic 256-256": [(256, 5), (256,), (256, 256), (256,), (1, 256), (1,)] * 2,
            "DQN 64-64": [(64, 4), (64,), (64, 64), (64,), (2, 64), (2,)],
            "SAC ent_coef": [(1,)]}


def candidates(params: list[torch.nn.Parameter]) -> dict:
    grads = [p.grad for p in params]
    return {"get_total_norm": lambda: float(torch.nn.utils.get_total_norm(grads, foreach=True)),
            "total_norm": lambda: float(total_norm(grads)),
            "clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_(params, 1e9, foreach=True),
            "clip_grad_norm": lambda: clip_grad_norm(params, 1e9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (the minimum is reported)")
    parser.add_argument("--number", type=int, default=500, help="calls per candidate per round")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, shapes in NETWORKS.items():
        params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        calls = candidates(params)
        seconds = interleaved({k: lambda f=f: timeit.timeit(f, number=args.number) for k, f in calls.items()},
                              args.rounds)
        us = {k: min(v) / args.number * 1e6 for k, v in seconds.items()}
        print(f"{name}: " + "  ".join(f"{k} {v:.1f} µs" for k, v in us.items())
              + f"  norm {us['total_norm'] / us['get_total_norm']:.2f}x"
              + f"  clip {us['clip_grad_norm'] / us['clip_grad_norm_']:.2f}x")
        rows.append({"gradients": name, **{f"{k}_us": v for k, v in us.items()},
                     "norm_vs_torch": us["total_norm"] / us["get_total_norm"],
                     "clip_vs_torch": us["clip_grad_norm"] / us["clip_grad_norm_"]})
    first = rows[0]
    _results.write(args.out, "grad_norm_bench", rows=rows,
                   headline=(f"{first['gradients']}: norm {first['norm_vs_torch']:.2f}x, clip "
                             f"{first['clip_vs_torch']:.2f}x torch's time"))


if __name__ == "__main__":
    main()
