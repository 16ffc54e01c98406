"""Full vs dense DQN gradient steps on SB3's NatureCNN Q-network, measured in one run.

One step is what SB3's ``DQN.train`` does per gradient step: target forward (no grad), online
forward, smooth-L1 loss, zero_grad, backward, grad clipping, Adam step. Variants, interleaved in
rounds so machine noise hits all of them alike:

- ``full``   — stock: every parameter trained on every step
- ``dense``  — the article's dense set (last 3 layers: q head, 512-unit linear, conv3) only
- ``preset`` — the article's schedule (``presets.ARTICLE_SCHEDULE``): 1 full step then 99 dense steps (amortised)

The FLOP ratio comes from the updater's own counters (``torch.utils.flop_counter``), with the
target forward added to both sides: ``(2F + B_dense) / (2F + B_full)``.

Usage:
    python -m benchmarks.updates_bench [--batch-sizes 32 512] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import rlaccel_plugins as rla
from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved, medians, seconds
from rlaccel_plugins.presets import ARTICLE_SCHEDULE


def make_policy():
    from gymnasium import spaces
    from stable_baselines3.dqn.policies import CnnPolicy

    obs_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    return CnnPolicy(obs_space, spaces.Discrete(6), lr_schedule=lambda _: 1e-4)


def dqn_step(policy, batch) -> None:
    obs, actions, next_obs, rewards, dones = batch
    with torch.no_grad():
        next_q = policy.q_net_target(next_obs).max(dim=1).values.reshape(-1, 1)
        target = rewards + (1 - dones) * 0.99 * next_q
    current = torch.gather(policy.q_net(obs), dim=1, index=actions)
    loss = F.smooth_l1_loss(current, target)
    policy.optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 10)
    policy.optimizer.step()


def make_batch(batch_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (batch_size, 4, 84, 84), generator=g, dtype=torch.uint8).float()
    next_obs = torch.randint(0, 256, (batch_size, 4, 84, 84), generator=g, dtype=torch.uint8).float()
    actions = torch.randint(0, 6, (batch_size, 1), generator=g)
    return obs, actions, next_obs, torch.rand(batch_size, 1, generator=g), torch.zeros(batch_size, 1)


def time_steps(policy, batch, steps: int) -> float:
    """Milliseconds per DQN update step, over ``steps`` steps."""
    return 1e3 * seconds(lambda: [dqn_step(policy, batch) for _ in range(steps)]) / steps


def bench(batch_size: int, steps: int, rounds: int) -> dict:
    torch.manual_seed(0)
    article = rla.load_config(preset="atari", **ARTICLE_SCHEDULE)  # the article's schedule (the preset trains full)
    preset = article.training
    batch = make_batch(batch_size)
    stock = make_policy()
    dense = make_policy()
    dense_upd = rla.SparseDenseUpdater(sparse_update_interval=10**9, dense_layers=preset.dense_layers)
    dense_upd.attach(dense.q_net, dense.optimizer, example_input=batch[0][:8], name="q_net")
    dqn_step(dense, batch)  # step 0 is full; every later step is dense
    scheduled = make_policy()
    preset_upd = rla.SparseDenseUpdater.from_config(article)
    preset_upd.attach(scheduled.q_net, scheduled.optimizer, example_input=batch[0][:8], name="q_net")
    for policy in (stock, dense, scheduled):
        time_steps(policy, batch, 2)  # warm-up
    times = interleaved({"full": lambda: time_steps(stock, batch, steps),
                         "dense": lambda: time_steps(dense, batch, steps),
                         "preset": lambda: time_steps(scheduled, batch, steps)}, rounds)
    med = medians(times)
    s = dense_upd.stats
    fwd = s["flops_forward"]
    flop_ratio = (2 * fwd + s["flops_backward_dense"]) / (2 * fwd + s["flops_backward_full"])
    return {"batch_size": batch_size, "ms_full": med["full"], "ms_dense": med["dense"], "ms_preset": med["preset"],
            "time_ratio_dense_full": med["dense"] / med["full"], "flop_ratio_dense_full": flop_ratio,
            "backward_flops_saved_fraction": s["backward_saved_fraction"],
            "preset_full_updates": preset_upd.stats["full_updates"],
            "preset_dense_updates": preset_upd.stats["dense_updates"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 512])
    parser.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    _results.add_out_argument(parser)
    args = parser.parse_args()
    print(f"NatureCNN DQN step on CPU, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'batch':>6} {'full ms':>9} {'dense ms':>9} {'preset ms':>10} {'time ratio':>11} {'FLOP ratio':>11} "
          f"{'bwd FLOPs saved':>16}")
    results = []
    for b in args.batch_sizes:
        r = bench(b, args.steps, args.rounds)
        results.append(r)
        print(f"{b:>6} {r['ms_full']:>9.1f} {r['ms_dense']:>9.1f} {r['ms_preset']:>10.1f} "
              f"{r['time_ratio_dense_full']:>11.3f} {r['flop_ratio_dense_full']:>11.3f} "
              f"{r['backward_flops_saved_fraction']:>15.1%}", flush=True)
    largest = results[-1]
    _results.write(args.out, "updates_bench", rows=results,
                   headline=(f"NatureCNN at batch {largest['batch_size']}: a dense step {largest['time_ratio_dense_full']:.3f} "
                             "of a full one's time"))


if __name__ == "__main__":
    main()
