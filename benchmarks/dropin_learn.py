"""Seconds for the same ``learn()``: stock SB3, the README's drop-in, and the drop-in with
``training.fused_optimizer``, in one run. Two tasks:

- ``dqn-cartpole``: CartPole-v1 DQN with RL Zoo's settings (256-256 net, batch 64, 128 gradient steps
  every 256 env steps), the ``classic_control`` preset;
- ``sac-pendulum``: InvertedPendulum-v5 SAC with SB3's defaults (256-256, batch
  256, one gradient step per env step after 100 random ones), the ``mujoco`` preset — the ``mujoco``
  bench suite's task.

A fixed amount of work, not time to a threshold: every variant runs the same env steps and so the same
gradient steps (``rlaccel bench`` measures time to 475, where seed noise decides more than speed). The
drop-in is the tiered buffer plus ``AccelerateCallback(preset=...)``: fused ``train()`` and lean
collection. ``--callback-only`` adds a variant with SB3's own ``ReplayBuffer`` and the callback, which
splits what the buffer costs or saves from what the callback does. Rounds alternate the order; each ratio is
the median over rounds of variant / stock within a round. Also reported: the share of stock's time in
``train()`` (Amdahl: what a faster update can give at most).

Usage:
    python benchmarks/dropin_learn.py [--task dqn-cartpole] [--steps 12000] [--rounds 3] [--callback-only]
    python benchmarks/dropin_learn.py --task sac-pendulum --steps 2000 --rounds 3 --callback-only
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
from rlaccel_sb3.train import zoo_settings
from stable_baselines3 import DQN, SAC

TASKS = {"dqn-cartpole": (DQN, "dqn", "CartPole-v1", "classic_control"),
         "sac-pendulum": (SAC, "sac", "InvertedPendulum-v5", "mujoco")}
VARIANTS = ("stock", "drop-in", "drop-in + fused_optimizer")
CALLBACK_ONLY = "SB3 ReplayBuffer + callback"


def learn_seconds(task: str, variant: str, steps: int) -> tuple[float, float]:
    """(seconds for ``learn(steps)``, seconds of it inside ``train()``)."""
    cls, algo, env_id, preset = TASKS[task]
    settings = zoo_settings(algo, env_id)
    settings.pop("n_timesteps", None)
    callback = None
    if variant != "stock":
        if variant != CALLBACK_ONLY:
            settings.update(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset=preset))
        callback = AccelerateCallback(preset=preset, fused_optimizer=variant.endswith("fused_optimizer"))
    model = cls("MlpPolicy", env_id, seed=0, device="cpu", **settings)
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
    parser.add_argument("--task", choices=sorted(TASKS), default="dqn-cartpole")
    parser.add_argument("--steps", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callback-only", action="store_true",
                        help="also SB3's own ReplayBuffer with the callback (no tiered buffer)")
    args = parser.parse_args()
    _, algo, env_id, _ = TASKS[args.task]
    variants = VARIANTS + ((CALLBACK_ONLY,) if args.callback_only else ())
    print(f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
          f"{env_id} {algo.upper()}, RL Zoo settings, learn({args.steps:,}), {args.rounds} interleaved rounds")
    seconds = {v: [] for v in variants}
    shares = []
    for r in range(args.rounds):
        for variant in variants if r % 2 == 0 else variants[::-1]:
            total, in_train = learn_seconds(args.task, variant, args.steps)
            seconds[variant].append(total)
            if variant == "stock":
                shares.append(in_train / total)
    print(f"  stock: train() is {100 * statistics.median(shares):.0f}% of learn()")
    print(f"  {'variant':<28} {'seconds':>8} {'vs stock':>9}")
    for variant in variants:
        ratio = statistics.median(v / s for v, s in zip(seconds[variant], seconds["stock"]))
        print(f"  {variant:<28} {statistics.median(seconds[variant]):>8.1f} {ratio:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
