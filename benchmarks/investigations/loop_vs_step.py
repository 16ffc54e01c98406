"""Does a ``train()`` call's steps as one compiled loop beat one compiled call per step (SAC, TD3)?

RL Zoo's Pendulum-v1 settings with ``gradient_steps=64``: a model filled past ``learning_starts``, copied
three times — the compiled loop (the model's ``gradient_steps`` is the call's), 64 compiled calls of one
step (the same model with ``gradient_steps=1``, trained 64 steps a call) and the eager fused update —
then ``--rounds`` interleaved rounds of one 64-step ``train()`` call each, on one thread. Reported: ms per
step (median over rounds), each variant's time as a ratio to the one-step calls (median of the per-round
ratios), and each first call's seconds (the compilation in the machine's first process, a load after).

Usage:
    python -m benchmarks.investigations.loop_vs_step --algo sac
    python -m benchmarks.investigations.loop_vs_step --algo td3 --rounds 15
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch


def measure(algo: str, steps: int, rounds: int) -> None:
    import stable_baselines3
    from rlaccel_sb3.fused import fused_train_for
    from rlaccel_sb3.train import zoo_settings

    settings = zoo_settings(algo, "Pendulum-v1")
    settings.pop("n_timesteps", None)
    settings["learning_starts"] = 1000
    model = getattr(stable_baselines3, algo.upper())("MlpPolicy", "Pendulum-v1", seed=0, device="cpu", **settings)
    model.learn(1500)
    models = {"loop": copy.deepcopy(model), "one-step calls": copy.deepcopy(model), "eager": copy.deepcopy(model)}
    models["loop"].gradient_steps = steps
    trains = {name: fused_train_for(m, compiled=name != "eager") for name, m in models.items()}
    for name, train in trains.items():
        start = time.perf_counter()
        train(steps, model.batch_size)
        print(f"{algo} {name}: first call {time.perf_counter() - start:.2f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in trains}
    for r in range(rounds):
        for name in list(trains) if r % 2 else list(trains)[::-1]:
            start = time.perf_counter()
            trains[name](steps, model.batch_size)
            times[name].append(time.perf_counter() - start)
    base = np.array(times["one-step calls"])
    for name, values in times.items():
        print(f"{algo} {name}: {np.median(values) / steps * 1e3:.3f} ms a step, "
              f"{np.median(np.array(values) / base):.3f}x the one-step calls' time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["sac", "td3"], default="sac")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    measure(args.algo, args.steps, args.rounds)


if __name__ == "__main__":
    main()
