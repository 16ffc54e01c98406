"""The `atari` preset's gradient step on the CPU — SB3's NatureCNN DQN at batch 512 — in channels-last
memory format and with glibc keeping large allocations on the heap, against as it runs today.

Four settings, each in fresh child processes (alternating order): contiguous or channels-last (rlaccel's
``ChannelsLast``, what ``training.channels_last`` installs: the convolutions' weights, moments and
inputs), glibc's default allocator or ``allocator_bench.KEEP_ON_HEAP``. Prints the median ms per step
and each setting's ratio to the default, and — since channels-last convolutions sum in another order —
how far 20 channels-last steps move the weights from 20 contiguous ones from the same start (not bit
for bit: a tolerance, as ``training.fused_optimizer`` has).

``--phases``: the DQN step (target forward, online forward, backward, Adam; uint8 frames in, as the
fused step hands them to SB3's Q-networks) contiguous against channels-last — converted at each
convolution's input, and ``+ frames``: converted as uint8 frames before SB3's preprocessing, as
``AccelerateCallback`` installs it — at batch 32 (RL Zoo's Atari DQN) and 512 (the `atari` preset), as a
full update and as the preset's sparse one (``dense_layers=[-3, -2, -1]``: the first two convolutions
frozen), in one process, interleaved rounds, default allocator.

Usage:
    python -m benchmarks.investigations.cnn_step_bench [--rounds 3] [--steps 6]
    python -m benchmarks.investigations.cnn_step_bench --phases [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.investigations.allocator_bench import run

SETUP = """
import gymnasium as gym, numpy as np
from stable_baselines3.dqn.policies import CnnPolicy
torch.manual_seed(0)
policy = CnnPolicy(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), lr_schedule=lambda _: 1e-4)
channels_last = {channels_last}
if channels_last:
    from rlaccel_plugins.fused.memory_format import ChannelsLast
    ChannelsLast([policy], [policy.optimizer])
obs = torch.randint(0, 256, (512, 4, 84, 84), dtype=torch.uint8)
act = torch.randint(0, 6, (512, 1))
def step():
    x = obs.float() / 255.0
    loss = policy.q_net(x).gather(1, act).square().mean()
    policy.optimizer.zero_grad(); loss.backward(); policy.optimizer.step()
"""


def _policy(channels_last: bool, sparse: bool = False, frames: bool = False):
    """SB3's NatureCNN DQN policy (seed 0) and, with ``channels_last``, the ``ChannelsLast`` holding its
    convolutions (with ``frames``, converting the Q-networks' uint8 frames too, as ``AccelerateCallback``
    does); ``sparse``: the `atari` preset's sparse phase (the first two convolutions frozen)."""
    import gymnasium as gym
    import numpy as np
    from rlaccel_sb3.networks import frame_input_networks
    from stable_baselines3.dqn.policies import CnnPolicy

    from rlaccel_plugins.fused.memory_format import ChannelsLast

    torch.manual_seed(0)
    policy = CnnPolicy(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), lr_schedule=lambda _: 1e-4)
    if sparse:
        for conv in [m for m in policy.q_net.modules() if isinstance(m, torch.nn.Conv2d)][:2]:
            conv.requires_grad_(False)
    frame_inputs = frame_input_networks(policy) if frames else ()
    return policy, ChannelsLast([policy], [policy.optimizer], frame_inputs) if channels_last else None


def drift(steps: int = 20) -> float:
    """Largest relative difference of any weight after ``steps`` channels-last steps against contiguous ones."""
    finals = []
    for channels_last in (False, True):
        policy, layout = _policy(channels_last)
        generator = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x = torch.randint(0, 256, (64, 4, 84, 84), generator=generator).float() / 255.0
            act = torch.randint(0, 6, (64, 1), generator=generator)
            loss = policy.q_net(x).gather(1, act).square().mean()
            policy.optimizer.zero_grad()
            loss.backward()
            policy.optimizer.step()
        if layout is not None:
            layout.remove()
        finals.append([p.detach().contiguous().clone() for p in policy.parameters()])
    return max(((a - b).abs().max() / a.abs().max().clamp_min(1e-12)).item() for a, b in zip(*finals))


PHASE_VARIANTS = {"contiguous": dict(channels_last=False), "channels-last": dict(channels_last=True),
                  "+ frames": dict(channels_last=True, frames=True)}


def phase_rows(rounds: int) -> None:
    """ms per DQN step (uint8 frames in, as the fused step hands them to the Q-networks), contiguous vs
    channels-last (converted at each convolution's input, or as uint8 frames before SB3's preprocessing),
    full and sparse, batch 32 and 512."""
    import time

    print(f"NatureCNN DQN step, ms (median of {rounds} interleaved rounds); ratios to contiguous")
    for batch, steps in ((32, 20), (512, 3)):
        obs = torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8)
        act = torch.randint(0, 6, (batch, 1))

        def step(policy, obs=obs, act=act):
            with torch.no_grad():
                target = policy.q_net_target(obs).max(dim=1).values
            loss = (policy.q_net(obs).gather(1, act).squeeze(1) - target).square().mean()
            policy.optimizer.zero_grad()
            loss.backward()
            policy.optimizer.step()

        for sparse in (False, True):
            policies = {name: _policy(sparse=sparse, **kw)[0] for name, kw in PHASE_VARIANTS.items()}
            times: dict[str, list[float]] = {name: [] for name in policies}
            for r in range(rounds):
                for name in list(policies) if r % 2 == 0 else list(policies)[::-1]:
                    step(policies[name])
                    start = time.perf_counter()
                    for _ in range(steps):
                        step(policies[name])
                    times[name].append(1e3 * (time.perf_counter() - start) / steps)
            ms = {name: statistics.median(t) for name, t in times.items()}
            cells = "  ".join(f"{name} {ms[name]:7.1f} ({ms[name] / ms['contiguous']:.2f}x)" for name in ms)
            print(f"  batch {batch:>3} {'sparse' if sparse else 'full':<6} {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--phases", action="store_true", help="full vs sparse steps at batch 32 and 512")
    args = parser.parse_args()
    if args.phases:
        phase_rows(args.rounds)
        return
    settings = [(cl, keep) for cl in (False, True) for keep in (False, True)]
    times: dict[tuple[bool, bool], list[float]] = {s: [] for s in settings}
    for r in range(args.rounds):
        for channels_last, keep in settings if r % 2 == 0 else settings[::-1]:
            times[(channels_last, keep)].append(run(SETUP.format(channels_last=channels_last), args.steps, keep))
    base = statistics.median(times[(False, False)])
    print(f"NatureCNN DQN step, batch 512, ms (median over {args.rounds} child processes)")
    for (channels_last, keep), t in times.items():
        ms = statistics.median(t)
        print(f"  {'channels-last' if channels_last else 'contiguous':<13} "
              f"{'large allocations on the heap' if keep else 'default allocator':<30} {ms:7.1f}  {ms / base:.2f}x")
    print(f"  weights after 20 steps, channels-last vs contiguous: max relative difference {drift():.2e}")


if __name__ == "__main__":
    main()
