"""The fused SB3 SAC/TD3 step with and without ``backward_to``, in one process.

``rlaccel_plugins.fused.kernels.backward_to`` backpropagates the actor's loss into the actor's
parameters only; SB3 (and Tianshou) also backpropagate it into the critic's weights, leave that in
their ``.grad`` and zero it before the critic's next step. This script runs the same fused ``train()``
twice per algorithm and size — once as it is, once with a plain ``actor_loss.backward()`` patched in —
interleaved (rounds alternate who goes first), and prints the median ms per gradient step of each
and their ratio (the first round of each is a warm-up and left out).

Usage:
    python -m benchmarks.investigations.backward_to_ab [--rounds 9] [--steps 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks import fused_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    import rlaccel_sb3.fused as sb3_fused
    from rlaccel_sb3.fused import fused_train_for

    own = sb3_fused.backward_to

    def plain(loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        loss.backward()

    print(f"torch threads {torch.get_num_threads()}; ms per gradient step, median of {args.rounds - 1} rounds")
    for algo in ("sac", "td3"):
        for hidden, batch in fused_bench.SIZES:
            models = {"plain": fused_bench.build(algo, hidden), "backward_to": fused_bench.build(algo, hidden)}
            trains = {name: fused_train_for(model) for name, model in models.items()}
            times: dict[str, list[float]] = {name: [] for name in models}
            for r in range(args.rounds):
                for name in list(models) if r % 2 == 0 else list(models)[::-1]:
                    sb3_fused.backward_to = own if name == "backward_to" else plain
                    start = time.perf_counter()
                    trains[name](args.steps, batch)
                    times[name].append(time.perf_counter() - start)
            sb3_fused.backward_to = own
            ms = {name: 1e3 * statistics.median(t[1:]) / args.steps for name, t in times.items()}
            print(f"  {algo} {'-'.join(map(str, hidden))} b{batch}: plain {ms['plain']:.2f}, backward_to "
                  f"{ms['backward_to']:.2f}, ratio {ms['backward_to'] / ms['plain']:.3f}", flush=True)


if __name__ == "__main__":
    main()
