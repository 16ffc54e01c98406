"""Peak memory of an SB3 DQN replay buffer of Atari frame stacks, filled whole: SB3's ``ReplayBuffer``, with
``optimize_memory_usage``, and the drop-in ``TieredReplayBuffer``.

Each buffer holds ``--transitions`` transitions (default 200,000) of 4x84x84 uint8 frame stacks from 8 env
streams (``benchmarks.replay_bench``'s consistent stacks: a step's next observation is the next step's
observation) and is filled to its capacity through SB3's ``add``, in a new process of its own: the figure is that
process's peak resident memory less its peak before the buffer was built (Linux ``ru_maxrss``), so it counts
what the buffer really touches, not what it reserves. 1,000,000 transitions (RL Zoo's Atari ``buffer_size`` in
SB3's defaults) are extrapolated from the measured bytes per transition: SB3's own buffer at that size needs
more memory than many machines have.

Usage:
    python -m benchmarks.buffer_memory [--transitions 200000] [--out benchmarks/results/buffer-memory]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource

from benchmarks import _results

VARIANTS = ("stock", "stock + optimize_memory_usage", "drop-in")
EXTRAPOLATED = 1_000_000


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def fill(variant: str, transitions: int) -> dict[str, float]:
    """In this process: build ``variant``'s buffer of ``transitions``, fill it, and measure the peak it added."""
    import numpy as np
    from gymnasium import spaces
    from rlaccel_sb3 import TieredReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer

    from benchmarks.replay_bench import FRAME, NUM_ENVS, STACK, make_stream

    stream = make_stream(512, episode=1000)
    before = _peak_bytes()
    cls = TieredReplayBuffer if variant == "drop-in" else ReplayBuffer
    buffer = cls(transitions, spaces.Box(0, 255, (STACK, *FRAME), np.uint8), spaces.Discrete(6), device="cpu",
                 n_envs=NUM_ENVS, optimize_memory_usage=variant == "stock + optimize_memory_usage",
                 handle_timeout_termination=False)
    infos = [{} for _ in range(NUM_ENVS)]
    for i in range(transitions // NUM_ENVS):
        step = stream[i % len(stream)]
        buffer.add(step["obs"], step["next_obs"], step["action"], step["reward"], step["terminated"], infos)
    stored = buffer.size() * NUM_ENVS
    buffer.sample(32)  # it samples as it stores
    added = _peak_bytes() - before
    return {"variant": variant, "transitions": stored, "peak_mb": added / 2**20,
            "bytes_per_transition": added / stored,
            "extrapolated_1m_gb": added / stored * EXTRAPOLATED / 2**30}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=200_000, help="each buffer's capacity, filled whole")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    _results.add_out_argument(parser)
    args = parser.parse_args(argv)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    if any(v not in VARIANTS for v in wanted):
        parser.error(f"--variants must name {', '.join(VARIANTS)}; got {args.variants}")
    if args.transitions < 8:
        parser.error(f"--transitions must be at least 8 (one step of the 8 streams), got {args.transitions}")
    rows = []
    print(f"{'buffer':<32} {'transitions':>11} {'peak MB':>9} {'bytes/transition':>17} {'1M, extrapolated':>17}")
    for variant in wanted:
        with multiprocessing.get_context("spawn").Pool(1) as pool:  # a new process: its own peak
            row = pool.apply(fill, (variant, args.transitions))
        rows.append(row)
        print(f"{variant:<32} {row['transitions']:>11,} {row['peak_mb']:>9,.0f} {row['bytes_per_transition']:>17,.0f} "
              f"{row['extrapolated_1m_gb']:>14,.1f} GB", flush=True)
    by = {row["variant"]: row for row in rows}
    headline = (f"{args.transitions:,} Atari transitions, peak memory: drop-in {by['drop-in']['peak_mb'] / 1024:.2f} GB, "
                f"SB3 {by['stock']['peak_mb'] / 1024:.2f} GB" if {"drop-in", "stock"} <= by.keys()
                else json.dumps(rows[0]))
    _results.write(args.out, "buffer_memory", headline=headline, rows=rows, argv=argv,
                   extrapolated_to=EXTRAPOLATED, frame_stack=[4, 84, 84])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
