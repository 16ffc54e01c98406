"""Seconds for the same ``learn()``: stock SB3, the README's drop-in, and the drop-in with
``training.fused_optimizer``, CartPole-v1 DQN with RL Zoo's settings (256-256 net, batch 64, 128
gradient steps every 256 env steps), in one run.

A fixed amount of work, not time to a threshold: every variant runs the same env steps and so the same
gradient steps (``rlaccel bench`` measures time to 475, where seed noise decides more than speed). The
drop-in is the tiered buffer (``classic_control`` preset) plus ``AccelerateCallback(preset=
"classic_control")``: fused ``train()`` and lean collection. Rounds alternate the order; each ratio is
the median over rounds of variant / stock within a round. Also reported: the share of stock's time in
``train()`` (Amdahl: what a faster update can give at most).

Usage:
    python benchmarks/dropin_learn.py [--steps 12000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
from rlaccel_sb3.train import zoo_settings
from stable_baselines3 import DQN

VARIANTS = ("stock", "drop-in", "drop-in + fused_optimizer")


def learn_seconds(variant: str, steps: int) -> tuple[float, float]:
    """(seconds for ``learn(steps)``, seconds of it inside ``train()``)."""
    settings = zoo_settings("dqn", "CartPole-v1")
    settings.pop("n_timesteps")
    callback = None
    if variant != "stock":
        settings.update(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="classic_control"))
        callback = AccelerateCallback(preset="classic_control", fused_optimizer=variant.endswith("fused_optimizer"))
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, device="cpu", **settings)
    in_train = [0.0]
    train = type(model).train

    def timed_train(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return train(self, *args, **kwargs)
        finally:
            in_train[0] += time.perf_counter() - start

    if variant == "stock":  # the drop-in swaps train() itself; its share is not reported
        model.train = timed_train.__get__(model)
    start = time.perf_counter()
    model.learn(steps, callback=callback)
    return time.perf_counter() - start, in_train[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
          f"CartPole-v1 DQN, RL Zoo settings, learn({args.steps:,}), {args.rounds} interleaved rounds")
    seconds = {v: [] for v in VARIANTS}
    shares = []
    for r in range(args.rounds):
        for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            total, in_train = learn_seconds(variant, args.steps)
            seconds[variant].append(total)
            if variant == "stock":
                shares.append(in_train / total)
    print(f"  stock: train() is {100 * statistics.median(shares):.0f}% of learn()")
    print(f"  {'variant':<28} {'seconds':>8} {'vs stock':>9}")
    for variant in VARIANTS:
        ratio = statistics.median(v / s for v, s in zip(seconds[variant], seconds["stock"]))
        print(f"  {variant:<28} {statistics.median(seconds[variant]):>8.1f} {ratio:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
