"""Seconds for the same ``learn()``: stock SB3, the README's drop-in, and the drop-in with
``training.fused_optimizer``, in one run. Three tasks:

- ``dqn-cartpole``: CartPole-v1 DQN with RL Zoo's settings (256-256 net, batch 64, 128 gradient steps
  every 256 env steps), the ``classic_control`` preset;
- ``sac-pendulum``: InvertedPendulum-v5 SAC with SB3's defaults (256-256, batch
  256, one gradient step per env step after 100 random ones), the ``mujoco`` preset — the ``mujoco``
  bench suite's task;
- ``ppo-cartpole``: CartPole-v1 PPO with RL Zoo's settings (8 envs x 32 steps, 20 epochs of minibatch
  256), the ``classic_control`` preset — the ``quick`` suite's PPO drop-in. PPO has no replay buffer: its
  drop-in is the callback alone, and it computes what stock computes, bit for bit, so a fixed-work time
  ratio is also its time-to-threshold ratio.

A fixed amount of work, not time to a threshold: every variant runs the same env steps and so the same
gradient steps (``rlaccel bench`` measures time to 475, where seed noise decides more than speed). The
drop-in is the tiered buffer plus ``AccelerateCallback(preset=...)``: fused ``train()`` and lean
collection. ``--callback-only`` adds a variant with SB3's own ``ReplayBuffer`` and the callback, which
splits what the buffer costs or saves from what the callback does. Rounds alternate the order; each ratio is
the median over rounds of variant / stock within a round. With ``--segment``, one model per variant
learns in segments of that many env steps, the variants taking turns (the order alternating), and the
ratio is the median over segments: the host's drifts over minutes then hit every variant alike.
Also reported: the share of stock's time in ``train()`` (Amdahl: what a faster update can give at most).

Usage:
    python -m benchmarks.dropin_learn [--task dqn-cartpole] [--steps 12000] [--rounds 3] [--callback-only]
    python -m benchmarks.dropin_learn --task sac-pendulum --steps 3000 --segment 250 --callback-only
    python -m benchmarks.dropin_learn --task ppo-cartpole --steps 16384 --segment 2048
        [--out benchmarks/results/dropin-lean-step]  (writes dropin_learn-<task>.json)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from functools import partial

import torch
from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
from rlaccel_sb3.train import zoo_settings
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.env_util import make_vec_env

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved

TASKS = {"dqn-cartpole": (DQN, "dqn", "CartPole-v1", "classic_control"),
         "sac-pendulum": (SAC, "sac", "InvertedPendulum-v5", "mujoco"),
         "ppo-cartpole": (PPO, "ppo", "CartPole-v1", "classic_control")}
VARIANTS = ("stock", "drop-in", "drop-in + fused_optimizer")
CALLBACK_ONLY = "SB3 ReplayBuffer + callback"


class Run:
    """One variant's model, learning in as many ``learn()`` calls as asked (the count goes on)."""

    def __init__(self, task: str, variant: str) -> None:
        cls, algo, env_id, preset = TASKS[task]
        settings = zoo_settings(algo, env_id)
        settings.pop("n_timesteps", None)
        self.callback = None
        if variant != "stock":
            if variant != CALLBACK_ONLY and cls is not PPO:
                settings.update(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset=preset))
            self.callback = AccelerateCallback(preset=preset, fused_optimizer=variant.endswith("fused_optimizer"))
        n_envs = settings.pop("n_envs", 1)
        env = make_vec_env(env_id, n_envs=n_envs, seed=0) if n_envs > 1 else env_id
        self.model = cls("MlpPolicy", env, seed=0, device="cpu", **settings)
        self.in_train, self.calls = 0.0, 0
        if variant == "stock":  # the drop-in swaps train() itself; its share is not reported
            train = type(self.model).train

            def timed_train(model, *args, **kwargs):
                start = time.perf_counter()
                try:
                    return train(model, *args, **kwargs)
                finally:
                    self.in_train += time.perf_counter() - start

            self.model.train = timed_train.__get__(self.model)

    def learn(self, steps: int) -> float:
        """Seconds for ``learn(steps)``, going on from the previous call."""
        start = time.perf_counter()
        self.model.learn(steps, callback=self.callback, reset_num_timesteps=self.calls == 0)
        self.calls += 1
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="dqn-cartpole")
    parser.add_argument("--steps", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--segment", type=int, default=None,
                        help="interleave the variants every SEGMENT env steps, each model going on where it "
                             "stopped (one round): a finer grain against the host's drifts than whole runs")
    parser.add_argument("--callback-only", action="store_true",
                        help="also SB3's own ReplayBuffer with the callback (no tiered buffer)")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    _, algo, env_id, _ = TASKS[args.task]
    if args.callback_only and args.task == "ppo-cartpole":
        parser.error("--callback-only compares replay buffers; PPO has none (its drop-in is the callback alone)")
    variants = VARIANTS + ((CALLBACK_ONLY,) if args.callback_only else ())
    print(f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
          f"{env_id} {algo.upper()}, RL Zoo settings, learn({args.steps:,}), "
          + (f"interleaved every {args.segment:,} env steps" if args.segment else f"{args.rounds} interleaved rounds"))
    shares = []
    if args.segment:  # one model per variant, each going on where it stopped
        runs = {v: Run(args.task, v) for v in variants}
        sizes = [min(args.segment, args.steps - start) for start in range(0, args.steps, args.segment)]
        # each call learns the variant's next segment
        seconds = interleaved({v: partial(next, map(runs[v].learn, sizes)) for v in variants}, len(sizes),
                              alternate=True)
        shares.append(runs["stock"].in_train / sum(seconds["stock"]))
    else:
        def whole_run(variant: str) -> float:
            run = Run(args.task, variant)
            elapsed = run.learn(args.steps)
            if variant == "stock":
                shares.append(run.in_train / elapsed)
            return elapsed

        seconds = interleaved({v: partial(whole_run, v) for v in variants}, args.rounds, alternate=True)
    print(f"  stock: train() is {100 * statistics.median(shares):.0f}% of learn()")
    total = sum if args.segment else statistics.median  # one round of segments, or whole runs
    print(f"  {'variant':<28} {'seconds':>8} {'vs stock':>9}  per {'segment' if args.segment else 'round'}")
    rows = []
    for variant in variants:
        ratios = [v / s for v, s in zip(seconds[variant], seconds["stock"])]
        print(f"  {variant:<28} {total(seconds[variant]):>8.1f} {statistics.median(ratios):>8.2f}x  "
              f"{min(ratios):.2f}-{max(ratios):.2f}x", flush=True)
        rows.append({"variant": variant, "seconds": total(seconds[variant]), "vs_stock": statistics.median(ratios),
                     "vs_stock_range": [min(ratios), max(ratios)]})
    dropin = next(row for row in rows if row["variant"] == "drop-in")
    _results.write(args.out, "dropin_learn", name=f"dropin_learn-{args.task}", rows=rows, task=args.task,
                   env_steps=args.steps, train_share_of_stock=statistics.median(shares),
                   headline=f"SB3 {algo.upper()} {env_id} `learn()`: {dropin['vs_stock']:.2f}x stock's time")


if __name__ == "__main__":
    main()
