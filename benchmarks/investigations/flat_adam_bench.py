"""Adam's step on the CPU: PyTorch's single-tensor and multi-tensor (``foreach``) implementations against
rlaccel's flat step (``rlaccel_plugins.fused.flat_optim``: the same bits, tested), and the single-kernel
``fused=True`` step (other rounding: what ``training.fused_optimizer`` asks for), then what the flat
step changes in the fused updates that use it.

1. µs per optimizer step, minimum of 15 interleaved rounds, on the gradients of a real backward (ReLU
   layers leave zeros in the second moments, as in training): the Q-networks of SB3's DQN (64-64,
   RL Zoo's 256-256) and Tianshou's DQN example (128-128-128), a SAC 256-256 critic.
2. ``torch.sqrt`` (the stage that bounds the flat step at 256-256) on 65,536 floats, random or zeros, against
   numpy's IEEE square root, and how often the two differ (``--all-floats``: over every float32 bit pattern;
   else a sample of 2**24): why the stage cannot be swapped for a faster one without leaving PyTorch's bits.
3. ms per gradient step of the fused SB3 DQN ``train()`` and the fused Tianshou DQN update with the
   flat step and with PyTorch's multi-tensor step (the flat step switched off), median of interleaved
   rounds — the same code otherwise.

Usage:
    python -m benchmarks.investigations.flat_adam_bench [--rounds 7] [--steps 64] [--all-floats]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import platform
import statistics
import time
import timeit

import torch

from rlaccel_plugins.fused import flat_optim

NETWORKS = {"DQN 64-64": (4, (64, 64), 2), "DQN 256-256": (4, (256, 256), 2),
            "Tianshou DQN 128-128-128": (4, (128, 128, 128), 2), "SAC critic 256-256": (4, (256, 256), 1)}


def _mlp(inputs: int, hidden: tuple[int, ...], outputs: int) -> torch.nn.Sequential:
    layers, width = [], inputs
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, outputs))


def optimizer_rows(rounds: int, number: int = 200) -> None:
    print("µs per Adam step, minimum of interleaved rounds (bit for bit PyTorch's: single, foreach, flat)")
    print(f"{'network':<26} {'single':>8} {'foreach':>8} {'flat':>8} {'fused':>8} {'flat/foreach':>13} {'flat/fused':>11}")
    for name, (inputs, hidden, outputs) in NETWORKS.items():
        torch.manual_seed(0)
        nets = [_mlp(inputs, hidden, outputs) for _ in range(4)]
        for net in nets[1:]:
            net.load_state_dict(nets[0].state_dict())
        optimizers = [torch.optim.Adam(nets[0].parameters(), lr=1e-3, foreach=False),
                      torch.optim.Adam(nets[1].parameters(), lr=1e-3, foreach=True),
                      torch.optim.Adam(nets[2].parameters(), lr=1e-3, foreach=True),
                      torch.optim.Adam(nets[3].parameters(), lr=1e-3, fused=True)]
        x = torch.randn(256, inputs)
        for net, optimizer in zip(nets, optimizers):
            for _ in range(20):  # real gradients and moments
                optimizer.zero_grad()
                (net(x) ** 2).mean().backward()
                optimizer.step() if optimizer is not optimizers[2] else flat_optim.optimizer_step(optimizer)
        calls = {"single": optimizers[0].step, "foreach": optimizers[1].step,
                 "flat": functools.partial(flat_optim.optimizer_step, optimizers[2]), "fused": optimizers[3].step}
        seconds: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(rounds):
            for k, f in calls.items():
                seconds[k].append(timeit.timeit(f, number=number))
        us = {k: min(v) / number * 1e6 for k, v in seconds.items()}
        print(f"{name:<26} {us['single']:>8.1f} {us['foreach']:>8.1f} {us['flat']:>8.1f} {us['fused']:>8.1f} "
              f"{us['flat'] / us['foreach']:>12.2f}x {us['flat'] / us['fused']:>10.2f}x")


def sqrt_rows(rounds: int, all_floats: bool, number: int = 500) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    values = {"random": rng.random(65_536, dtype=np.float32), "10% zeros": rng.random(65_536, dtype=np.float32),
              "zeros": np.zeros(65_536, np.float32)}
    values["10% zeros"][rng.random(65_536) < 0.1] = 0
    print(f"\nµs per square root of 65,536 float32, minimum of {rounds} rounds")
    for name, array in values.items():
        tensor = torch.from_numpy(array)
        torch_us = min(timeit.repeat(functools.partial(torch.sqrt, tensor), number=number, repeat=rounds)) / number * 1e6
        numpy_us = min(timeit.repeat(functools.partial(np.sqrt, array), number=number, repeat=rounds)) / number * 1e6
        print(f"  {name:<10} torch.sqrt {torch_us:7.1f}   numpy.sqrt {numpy_us:7.1f}")
    chunk, differ, total = 1 << 24, 0, 0
    starts = range(0, 0x7F800000, chunk) if all_floats else [int(rng.integers(0, 0x7F800000 - chunk))]
    for start in starts:  # non-negative finite floats
        bits = np.arange(start, min(start + chunk, 0x7F800000), dtype=np.uint32)
        x = bits.view(np.float32)
        differ += int((np.sqrt(x).view(np.uint32) != torch.sqrt(torch.from_numpy(x)).numpy().view(np.uint32)).sum())
        total += len(bits)
    print(f"  torch.sqrt differs from the IEEE square root for {differ:,} of {total:,} float32 inputs "
          f"({100 * differ / total:.2f}%)")


def _interleaved(calls: dict, steps: int, rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(rounds):
        for name, call in (list(calls.items()) if r % 2 == 0 else list(calls.items())[::-1]):
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {k: 1e3 * statistics.median(v) / steps for k, v in times.items()}


def _flat(on: bool, call):
    def run():
        with contextlib.nullcontext() if on else flat_optim.plain_steps():
            call()
    return run


def update_rows(steps: int, rounds: int) -> None:
    from rlaccel_sb3.fused import fused_train_for

    from benchmarks import fused_bench

    print(f"\nms per gradient step, median of {rounds} interleaved rounds of {steps} steps")
    print(f"{'update':<34} {'multi-tensor':>12} {'flat':>8} {'flat/multi':>11}")
    for hidden, batch in fused_bench.SIZES:
        models = [fused_bench.build("dqn", hidden), fused_bench.build("dqn", hidden)]
        trains = [fused_train_for(m) for m in models]
        for t in trains:
            t(2, batch)
        ms = _interleaved({"multi": _flat(False, functools.partial(trains[0], steps, batch)),
                           "flat": _flat(True, functools.partial(trains[1], steps, batch))}, steps, rounds)
        label = f"SB3 DQN {'-'.join(map(str, hidden))} batch {batch}"
        print(f"{label:<34} {ms['multi']:>12.2f} {ms['flat']:>8.2f} {ms['flat'] / ms['multi']:>10.2f}x")
    tianshou_row(steps, rounds)


def tianshou_row(steps: int, rounds: int) -> None:
    import gymnasium as gym
    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net
    from tianshou.utils.torch_utils import policy_within_training_step

    from rlaccel_plugins.loader import load_config

    def wrapped():
        torch.manual_seed(0)
        policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[128, 128, 128]),
                                         action_space=gym.spaces.Discrete(2), eps_training=0.1)
        algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3,
                        target_update_freq=320)
        return SparseDenseWrapper(algorithm, config=load_config(preset="classic_control", fused_updates=True))

    algorithms = [wrapped(), wrapped()]
    buffer = VectorReplayBuffer(20_000, 10)
    collector = Collector(copy.deepcopy(algorithms[0].wrapped_algorithm),
                          DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(10)]), buffer)
    collector.reset()
    collector.collect(n_step=10_000, random=True)

    def updates(algorithm):
        def run():
            for _ in range(steps):
                algorithm.update(buffer, 64)
        return run

    with policy_within_training_step(algorithms[0].policy), policy_within_training_step(algorithms[1].policy):
        for algorithm in algorithms:
            algorithm.update(buffer, 64)
        ms = _interleaved({"multi": _flat(False, updates(algorithms[0])),
                           "flat": _flat(True, updates(algorithms[1]))}, steps, rounds)
    label = "Tianshou DQN 128-128-128 batch 64"
    print(f"{label:<34} {ms['multi']:>12.2f} {ms['flat']:>8.2f} {ms['flat'] / ms['multi']:>10.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--all-floats", action="store_true", help="compare the square roots over every float32")
    args = parser.parse_args()
    print(f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    optimizer_rows(max(args.rounds, 15))
    sqrt_rows(max(args.rounds, 15), args.all_floats)
    update_rows(args.steps, args.rounds)


if __name__ == "__main__":
    main()
