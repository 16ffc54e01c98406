"""Overhead of the SB3 adapter's tiered buffer, and of the whole drop-in, vs stock SB3, CartPole-v1
DQN (RL Zoo settings), in one run.

Costs timed in interleaved rounds (stock, tiered, drop-in, stock, ...); an overhead is the median over
rounds of the variant/stock ratio within a round (robust to the host's slow phases):

- per env step: ``learn()`` with no gradient steps (policy inference, env step, buffer add, callbacks),
  for the tiered buffer alone and for the drop-in the README shows (tiered buffer +
  ``AccelerateCallback(preset="classic_control")``);
- per gradient step: ``train()`` on a full buffer (buffer sample + DQN update), RL Zoo's batch 64

Usage:
    python -m benchmarks.sb3_overhead [--env-steps 20000] [--grad-steps 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
import timeit

import numpy as np
import torch
from rlaccel_sb3 import TieredReplayBuffer
from rlaccel_sb3.train import zoo_settings
from stable_baselines3 import DQN

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved, median_ratio, medians, round_ratios


def make(tiered: bool, **kw) -> DQN:
    settings = zoo_settings("dqn", "CartPole-v1")
    settings.pop("n_timesteps")
    extra = dict(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="classic_control")) \
        if tiered else {}
    return DQN("MlpPolicy", "CartPole-v1", seed=0, **{**settings, **kw}, **extra)


def env_step_us(tiered: bool, steps: int, dropin: bool = False) -> float:
    from rlaccel_sb3 import AccelerateCallback

    model = make(tiered, learning_starts=0, train_freq=256, gradient_steps=0)
    callback = AccelerateCallback(preset="classic_control") if dropin else None
    start = time.perf_counter()
    model.learn(steps, callback=callback)
    return 1e6 * (time.perf_counter() - start) / steps


def grad_step_ms(model: DQN, steps: int) -> float:
    start = time.perf_counter()
    model.train(gradient_steps=steps, batch_size=64)
    return 1e3 * (time.perf_counter() - start) / steps


def buffer_call_us(model: DQN) -> tuple[float, float]:
    """Best-of-5 cost of one buffer add and one sample(64), in microseconds (the low-noise view)."""
    buf = model.replay_buffer
    obs = np.zeros((1, 4), np.float32)
    args = (obs, obs, np.array([1]), np.array([1.0], np.float32), np.array([False]), [{}])
    state = (buf.pos, buf.full)
    add = min(timeit.repeat(lambda: buf.add(*args), number=5000, repeat=5)) / 5000 * 1e6
    buf.pos, buf.full = state  # leave the filled buffer as it was for the timing of train()
    sample = min(timeit.repeat(lambda: buf.sample(64), number=2000, repeat=5)) / 2000 * 1e6
    return add, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-steps", type=int, default=10_000)
    parser.add_argument("--grad-steps", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--fill", type=int, default=50_000, help="transitions in the buffers the gradient steps sample")
    _results.add_out_argument(parser)
    args = parser.parse_args()

    trained = {}
    for tiered in (False, True):  # fill each buffer once for the gradient-step timing
        model = make(tiered, learning_starts=0, train_freq=256, gradient_steps=0)
        model.learn(args.fill)
        model.policy.set_training_mode(True)
        trained[tiered] = model
    rounds = interleaved({
        "env_stock": lambda: env_step_us(False, args.env_steps),
        "grad_stock": lambda: grad_step_ms(trained[False], args.grad_steps),
        "env_tiered": lambda: env_step_us(True, args.env_steps),
        "grad_tiered": lambda: grad_step_ms(trained[True], args.grad_steps),
        "env_dropin": lambda: env_step_us(True, args.env_steps, dropin=True)}, args.rounds)
    times = {k: rounds[k] for k in ("env_stock", "env_tiered", "env_dropin", "grad_stock", "grad_tiered")}
    calls = {name: buffer_call_us(trained[tiered]) for tiered, name in ((False, "stock"), (True, "tiered"))}
    med = medians(times)
    ratio = {kind: median_ratio(times, f"{kind}_tiered", f"{kind}_stock") for kind in ("env", "grad")}
    dropin = median_ratio(times, "env_dropin", "env_stock")
    result = {**med, "env_step_overhead": ratio["env"] - 1, "grad_step_overhead": ratio["grad"] - 1,
              "dropin_env_step_overhead": dropin - 1,
              "rounds": times, "add_us": {k: v[0] for k, v in calls.items()},
              "sample64_us": {k: v[1] for k, v in calls.items()}}
    print(f"CartPole-v1 DQN, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} interleaved rounds")
    print(f"per env step:      stock {med['env_stock']:8.1f} us   tiered {med['env_tiered']:8.1f} us   "
          f"overhead {result['env_step_overhead']:+.1%}")
    print(f"per env step:      stock {med['env_stock']:8.1f} us   drop-in {med['env_dropin']:7.1f} us   "
          f"overhead {dropin - 1:+.1%}  (tiered buffer + AccelerateCallback)")
    print(f"per gradient step: stock {med['grad_stock']:8.3f} ms   tiered {med['grad_tiered']:8.3f} ms   "
          f"overhead {result['grad_step_overhead']:+.1%}")
    spread = {kind: round_ratios(times, f"{kind}_tiered", f"{kind}_stock") for kind in ("env", "grad")}
    spread["dropin"] = round_ratios(times, "env_dropin", "env_stock")
    print(f"per-round ratio range: env step {spread['env'].min():.2f}-{spread['env'].max():.2f} "
          f"(drop-in {spread['dropin'].min():.2f}-{spread['dropin'].max():.2f}), "
          f"gradient step {spread['grad'].min():.2f}-{spread['grad'].max():.2f}")
    print(f"buffer.add: stock {calls['stock'][0]:.1f} us, tiered {calls['tiered'][0]:.1f} us; "
          f"sample(64): stock {calls['stock'][1]:.1f} us, tiered {calls['tiered'][1]:.1f} us (best of 5)")
    _results.write(args.out, "sb3_overhead", rows=[result],
                   headline=f"the drop-in per env step: {dropin - 1:+.1%} against stock")


if __name__ == "__main__":
    main()
