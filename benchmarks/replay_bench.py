"""Replay engine vs SB3 and Tianshou buffers on Atari-shaped data, in one run.

Data: 4x84x84 uint8 frame stacks from 8 env streams (consistent stacks: next_obs of a step is the
obs of the next one; an episode ends every ``--episode`` agent steps), the ``atari`` preset's
126,000-transition capacity. Measured per buffer: add throughput over a fill that wraps the ring,
sample(512) latency (median), bytes per stored transition (allocated arrays / capacity).

Usage:
    python -m benchmarks.replay_bench                 # full size (~5 GB RAM, a few minutes)
    python -m benchmarks.replay_bench --capacity-scale 0.1 --out benchmarks/results/replay-bench
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch

import rlaccel_plugins as rla
from benchmarks import _results

NUM_ENVS, STACK, FRAME = 8, 4, (84, 84)


def make_stream(steps: int, episode: int, seed: int = 0) -> list[dict]:
    """``steps`` lock-step transitions of 8 Atari-shaped streams; the list is cycled by the benches."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(steps + STACK, NUM_ENVS, *FRAME), dtype=np.uint8)
    out = []
    for t in range(steps):
        start = (t // episode) * episode                 # stacks never reach back before an episode start
        idx = [max(start, t + j) for j in range(STACK)]
        nidx = [max(start, t + 1 + j) for j in range(STACK)]
        obs = np.ascontiguousarray(frames[idx].swapaxes(0, 1))
        next_obs = np.ascontiguousarray(frames[nidx].swapaxes(0, 1))
        done = np.full(NUM_ENVS, (t + 1) % episode == 0)
        out.append(dict(obs=obs, next_obs=next_obs, action=rng.integers(0, 6, NUM_ENVS),
                        reward=rng.random(NUM_ENVS).astype(np.float32), terminated=done,
                        truncated=np.zeros(NUM_ENVS, bool)))
    return out


def timed_adds(add, stream: list[dict], n_adds: int) -> float:
    start = time.perf_counter()
    for i in range(n_adds):
        add(stream[i % len(stream)])
    return time.perf_counter() - start


def median_sample_ms(sample, repeats: int, warmup: int = 20) -> float:
    # warm-up matters: the first large (14 MB) batches pay page faults until malloc's mmap threshold
    # adapts; a training loop lives in the steady state measured after it
    for _ in range(warmup):
        sample()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sample()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


# ------------------------------------------------------------------ the contenders
def bench_rlaccel(caps, stream, n_adds, repeats):
    buf = rla.TieredReplay(level_capacity=caps, sampling_ratio=[0.7, 0.2, 0.08, 0.02], num_envs=NUM_ENVS, seed=0)
    add_s = timed_adds(lambda tr: buf.add(**tr), stream, n_adds)

    def sample():
        s = buf.sample(512)
        return {k: torch.from_numpy(v) for k, v in s.data.items()}  # what an adapter hands to torch

    return add_s, median_sample_ms(sample, repeats), buf.nbytes, buf.capacity


def bench_sb3(capacity, stream, n_adds, repeats, optimize_memory_usage):
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    rb = ReplayBuffer(capacity, spaces.Box(0, 255, (STACK, *FRAME), np.uint8), spaces.Discrete(6), device="cpu",
                      n_envs=NUM_ENVS, optimize_memory_usage=optimize_memory_usage, handle_timeout_termination=False)
    infos = [{} for _ in range(NUM_ENVS)]
    add_s = timed_adds(lambda tr: rb.add(tr["obs"], tr["next_obs"], tr["action"], tr["reward"], tr["terminated"],
                                         infos), stream, n_adds)
    arrays = [rb.observations, rb.actions, rb.rewards, rb.dones, rb.timeouts]
    if not optimize_memory_usage:
        arrays.append(rb.next_observations)
    return add_s, median_sample_ms(lambda: rb.sample(512), repeats), sum(a.nbytes for a in arrays), capacity


def bench_tianshou(capacity, stream, n_adds, repeats, prioritized):
    from tianshou.data import Batch, PrioritizedVectorReplayBuffer, VectorReplayBuffer

    kw = dict(ignore_obs_next=True, save_only_last_obs=True, stack_num=STACK)  # the Atari examples' settings
    if prioritized:
        buf = PrioritizedVectorReplayBuffer(capacity, NUM_ENVS, alpha=0.6, beta=0.4, **kw)
    else:
        buf = VectorReplayBuffer(capacity, NUM_ENVS, **kw)
    ids = np.arange(NUM_ENVS)

    def add(tr):
        buf.add(Batch(obs=tr["obs"], act=tr["action"], rew=tr["reward"], terminated=tr["terminated"],
                      truncated=tr["truncated"], obs_next=tr["next_obs"], info={}), buffer_ids=ids)

    add_s = timed_adds(add, stream, n_adds)
    nbytes = sum(v.nbytes for v in buf._meta.values() if isinstance(v, np.ndarray))
    return add_s, median_sample_ms(lambda: buf.sample(512), repeats), nbytes, capacity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity-scale", type=float, default=1.0, help="scale the atari preset's tiers")
    parser.add_argument("--episode", type=int, default=1000, help="agent steps per episode")
    parser.add_argument("--repeats", type=int, default=100, help="sample(512) calls timed per buffer")
    parser.add_argument("--skip", default="", help="comma list of contenders to skip")
    _results.add_out_argument(parser)
    args = parser.parse_args()

    caps = [max(NUM_ENVS, int(c * args.capacity_scale)) for c in (1000, 5000, 20000, 100000)]
    capacity = sum(caps)
    rows = capacity // NUM_ENVS
    n_adds = rows + rows // 10  # fill the ring and wrap 10% past it
    stream = make_stream(min(2048, n_adds), args.episode)
    contenders = {
        "rlaccel TieredReplay (atari preset)": lambda: bench_rlaccel(caps, stream, n_adds, args.repeats),
        "SB3 ReplayBuffer optimize_memory_usage=True": lambda: bench_sb3(capacity, stream, n_adds, args.repeats, True),
        "SB3 ReplayBuffer (default)": lambda: bench_sb3(capacity, stream, n_adds, args.repeats, False),
        "Tianshou VectorReplayBuffer (Atari example settings)":
            lambda: bench_tianshou(capacity, stream, n_adds, args.repeats, False),
        "Tianshou PrioritizedVectorReplayBuffer": lambda: bench_tianshou(capacity, stream, n_adds, args.repeats, True),
    }
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    results = {}
    print(f"capacity {capacity:,} transitions, {NUM_ENVS} envs, 4x84x84 uint8, {n_adds:,} adds; "
          f"{platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}")
    print(f"{'buffer':<54} {'adds/s':>9} {'transitions/s':>14} {'sample(512) ms':>15} {'bytes/transition':>17}")
    for name, run in contenders.items():
        if any(s in name for s in skip):
            continue
        add_s, sample_ms, nbytes, cap = run()
        results[name] = {"adds_per_s": n_adds / add_s, "transitions_per_s": n_adds * NUM_ENVS / add_s,
                         "sample512_ms": sample_ms, "bytes_per_transition": nbytes / cap}
        r = results[name]
        print(f"{name:<54} {r['adds_per_s']:>9.0f} {r['transitions_per_s']:>14.0f} {sample_ms:>15.2f} "
              f"{r['bytes_per_transition']:>17,.0f}", flush=True)
    ours = results.get("rlaccel TieredReplay (atari preset)")
    sb3 = results.get("SB3 ReplayBuffer optimize_memory_usage=True")
    headline = "no comparison with SB3's optimize_memory_usage run"
    if ours and sb3:
        print(f"\nvs SB3 optimize_memory_usage: add rate {ours['adds_per_s'] / sb3['adds_per_s']:.2f}x, "
              f"sample time {ours['sample512_ms'] / sb3['sample512_ms']:.2f}x, "
              f"memory {ours['bytes_per_transition'] / sb3['bytes_per_transition']:.2f}x")
        headline = (f"Atari-shaped data: {ours['bytes_per_transition'] / sb3['bytes_per_transition']:.2f}x the bytes "
                    "per transition of SB3's optimize_memory_usage")
    _results.write(args.out, "replay_bench", rows=[{"buffer": name, **r} for name, r in results.items()],
                   capacity=capacity, num_envs=NUM_ENVS, headline=headline)


if __name__ == "__main__":
    main()
