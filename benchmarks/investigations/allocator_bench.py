"""A gradient step with large temporaries, under glibc's default allocator settings and with large
allocations kept on the heap, in one run.

glibc's ``malloc`` maps allocations above a (dynamic) threshold with ``mmap`` and gives them back to the
OS when freed, and trims the top of the heap past another threshold: a step whose temporaries are tens
of MB — a NatureCNN at batch 512, QR-DQN's batch x 200 x 200 quantile loss — then maps, page-faults in
and unmaps them on every step. ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` (read by glibc
at process start) keep them on the heap. Each workload runs in fresh child processes, alternately with
and without the two variables, and the script prints the median ms per step of each and their ratio.

Usage:
    python -m benchmarks.investigations.allocator_bench [--rounds 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

KEEP_ON_HEAP = {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000"}

WORKLOADS = {
    "NatureCNN DQN step, batch 512 (SB3 CnnPolicy, 4x84x84 frames)": """
import gymnasium as gym, numpy as np
from stable_baselines3.dqn.policies import CnnPolicy
policy = CnnPolicy(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), lr_schedule=lambda _: 1e-4)
obs = torch.randint(0, 256, (512, 4, 84, 84), dtype=torch.uint8)
act = torch.randint(0, 6, (512, 1))
def step():
    loss = policy.q_net(obs.float() / 255.0).gather(1, act).square().mean()
    policy.optimizer.zero_grad(); loss.backward(); policy.optimizer.step()
""",
    "QR-DQN quantile Huber loss step, batch 64 x 200 quantiles (sb3-contrib's loss)": """
from sb3_contrib.common.utils import quantile_huber_loss
net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                          torch.nn.Linear(64, 400))
optimizer = torch.optim.Adam(net.parameters())
obs, target = torch.randn(64, 4), torch.randn(64, 200)
act = torch.randint(0, 2, (64, 1, 1)).expand(64, 200, 1)
def step():
    current = net(obs).view(64, 200, 2).gather(2, act).squeeze(2)
    loss = quantile_huber_loss(current, target, sum_over_quantiles=True)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
""",
}

CHILD = """
import statistics, sys, time, torch
torch.set_num_threads(2)
{setup}
step()
times = []
for _ in range({steps}):
    start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
print(1e3 * statistics.median(times))
"""


def run(setup: str, steps: int, keep: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k not in KEEP_ON_HEAP}
    if keep:
        env.update(KEEP_ON_HEAP)
    out = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, steps=steps)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="child processes per setting (alternating)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per child (after one warm-up)")
    args = parser.parse_args()
    print(f"ms per step, median over {args.rounds} child processes each (median of {args.steps} steps in each)")
    for name, setup in WORKLOADS.items():
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for keep in (False, True) if r % 2 == 0 else (True, False):
                times[keep].append(run(setup, args.steps, keep))
        default, kept = statistics.median(times[False]), statistics.median(times[True])
        print(f"  {name}: default {default:.1f}, large allocations on the heap {kept:.1f}, "
              f"ratio {kept / default:.2f}", flush=True)


if __name__ == "__main__":
    main()
