"""Per-step cost of the Tianshou adapter's buffer vs stock Tianshou, CartPole-v1 DQN, in one run.

Tianshou's ``test/discrete/test_dqn.py`` settings (10 envs, 10 env steps per collect, 0.1 gradient
steps per env step, batch 64, 20k buffer, n-step 3), ``run_training`` for a fixed number of env
steps, no evaluation. Three variants, interleaved in rounds:

- ``stock``  — ``VectorReplayBuffer``
- ``tiered`` — ``TieredVectorReplayBuffer`` (tiered sampling + incremental ``hasnull``)
- ``tiered, stock hasnull`` — the same with Tianshou's full-buffer ``hasnull`` put back, so the
  tiering's own cost and the ``hasnull`` fix (a Tianshou 2.0.1 inefficiency, not a tiering gain)
  are reported separately.

A second table times one ``hasnull()`` call on an Atari-shaped buffer (4x84x84 stacks stored as
last frames), the trainer's per-training-step check.

Usage:
    python -m benchmarks.tianshou_overhead [--env-steps 20000] [--rounds 3] [--atari-size 20000]
"""

from __future__ import annotations

import argparse
import functools
import time

import gymnasium as gym
import numpy as np
import torch
from rlaccel_tianshou import TieredVectorReplayBuffer
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, ReplayBufferManager, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved, medians

TIERS = dict(level_capacity=[2000, 18000], sampling_ratio=[0.3, 0.7])


class TieredWithStockHasnull(TieredVectorReplayBuffer):
    """The tiered buffer with Tianshou's own full-buffer check, to isolate the tiering cost."""

    def hasnull(self) -> bool:
        return ReplayBufferManager.hasnull(self)


def make_buffer(variant: str):
    if variant == "stock":
        return VectorReplayBuffer(20_000, 10)
    cls = TieredVectorReplayBuffer if variant == "tiered" else TieredWithStockHasnull
    return cls(20_000, 10, **TIERS)


def run(variant: str, env_steps: int) -> float:
    """Seconds per env step of ``run_training`` (collection + updates + the trainer's checks)."""
    torch.manual_seed(0)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(10)])
    envs.seed(0)
    net = Net(state_shape=4, action_shape=2, hidden_sizes=[128, 128, 128, 128])
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(2), eps_training=0.1)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3,
                    target_update_freq=320)
    collector = Collector(algorithm, envs, make_buffer(variant), exploration_noise=True)
    collector.reset()
    collector.collect(n_step=640, random=True)
    start = time.perf_counter()
    algorithm.run_training(OffPolicyTrainerParams(
        training_collector=collector, test_collector=None, max_epochs=1, epoch_num_steps=env_steps,
        collection_step_num_env_steps=10, batch_size=64, update_step_num_gradient_steps_per_sample=0.1,
        show_progress=False, verbose=False))
    return (time.perf_counter() - start) / env_steps


def atari_hasnull_ms(size: int) -> dict[str, float]:
    """One trainer-style ``hasnull()`` (after 10 new transitions) on a full Atari-shaped buffer."""
    rng = np.random.default_rng(0)
    out = {}
    for variant in ("stock", "tiered"):
        kw = dict(ignore_obs_next=True, save_only_last_obs=True, stack_num=4)
        buf = VectorReplayBuffer(size, 10, **kw) if variant == "stock" else \
            TieredVectorReplayBuffer(size, 10, level_capacity=[size // 10, size - size // 10],
                                     sampling_ratio=[0.5, 0.5], **kw)
        frames = rng.integers(0, 256, (10, 4, 84, 84), dtype=np.uint8)
        for _ in range(size // 10 + 1):
            buf.add(Batch(obs=frames, act=np.zeros(10, int), rew=np.zeros(10), terminated=np.zeros(10, bool),
                          truncated=np.zeros(10, bool), obs_next=frames, info=Batch()), buffer_ids=np.arange(10))
        buf.hasnull()  # the first call checks everything (both variants)
        buf.add(Batch(obs=frames, act=np.zeros(10, int), rew=np.zeros(10), terminated=np.zeros(10, bool),
                      truncated=np.zeros(10, bool), obs_next=frames, info=Batch()), buffer_ids=np.arange(10))
        start = time.perf_counter()
        buf.hasnull()
        out[variant] = 1e3 * (time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--atari-size", type=int, default=20_000)
    _results.add_out_argument(parser)
    args = parser.parse_args()
    variants = ("stock", "tiered", "tiered, stock hasnull")
    times = interleaved({v: functools.partial(run, v, args.env_steps) for v in variants}, args.rounds)
    med = {v: m * 1e6 for v, m in medians(times).items()}
    print(f"CartPole-v1 DQN (Tianshou test_dqn settings), {args.env_steps} env steps, median of {args.rounds} rounds")
    for v in variants:
        print(f"  {v:<24} {med[v]:8.1f} us per env step   ({med[v] / med['stock']:.2f}x stock)")
    print(f"  tiering alone (tiered with stock hasnull / stock): {med['tiered, stock hasnull'] / med['stock']:.2f}x")
    print(f"  hasnull fix alone (tiered / tiered with stock hasnull): {med['tiered'] / med['tiered, stock hasnull']:.2f}x")
    atari = atari_hasnull_ms(args.atari_size)
    print(f"hasnull() on a full {args.atari_size:,}-transition Atari buffer: stock {atari['stock']:.0f} ms, "
          f"tiered (incremental) {atari['tiered']:.2f} ms")
    _results.write(args.out, "tianshou_overhead", rows=[{"variant": v, "us_per_env_step": med[v],
                                                          "vs_stock": med[v] / med["stock"]} for v in variants],
                   rounds=times, atari_hasnull_ms=atari,
                   headline=f"the tiered buffer per env step: {med['tiered'] / med['stock']:.2f}x stock's time")


if __name__ == "__main__":
    main()
