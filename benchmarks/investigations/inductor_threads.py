"""Do inductor's own loops on two threads (``cpp.threads=2``) speed up a compiled TD3 step on 400x300 networks?

The compiled step runs inductor's loops on one thread (``rlaccel_plugins.fused.compiled_step.OPTIONS``) and its
matrix products on torch's threads. At RL Zoo's TD3 Pendulum settings the step's products alone take about
half the step on two threads (``benchmarks.peer_phases --task td3-pendulum``), so the rest — Adam over 365k
parameters, the Polyak averages, the bias gradients — might gain from a second thread. Compiles the step with
``--cpp-threads`` (one process per setting: the option is read at compile time), fills a model past
``learning_starts``, then times 8 calls of 64 steps each, compiled and eager fused, at 2 torch threads.

Usage:
    python -m benchmarks.investigations.inductor_threads --cpp-threads 1
    python -m benchmarks.investigations.inductor_threads --cpp-threads 2
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpp-threads", type=int, default=1)
    args = parser.parse_args()
    import stable_baselines3
    from rlaccel_sb3.fused import fused_train_for
    from rlaccel_sb3.train import zoo_settings

    from rlaccel_plugins.fused import compiled_step

    compiled_step.OPTIONS["cpp.threads"] = args.cpp_threads
    torch.set_num_threads(2)
    settings = zoo_settings("td3", "Pendulum-v1")
    settings.pop("n_timesteps", None)
    settings["learning_starts"] = 1000
    model = stable_baselines3.TD3("MlpPolicy", "Pendulum-v1", seed=0, device="cpu", **settings)
    model.learn(1300)
    trains = {name: fused_train_for(copy.deepcopy(model), compiled=name == "compiled") for name in ("compiled", "eager")}
    for train in trains.values():
        train(64, 256)  # compiles (or loads) the step
    times: dict[str, list[float]] = {name: [] for name in trains}
    for _ in range(8):
        for name, train in trains.items():
            start = time.perf_counter()
            train(64, 256)
            times[name].append(time.perf_counter() - start)
    figures = ", ".join(f"{name} {np.median(v) / 64 * 1e3:.2f} ms" for name, v in times.items())
    print(f"cpp.threads={args.cpp_threads}, 2 torch threads: {figures} a gradient step")


if __name__ == "__main__":
    main()
