"""Does building inductor's C++ wrapper apart from its kernels (``cpp_wrapper_build_separate``) cut the cold compile
of a compiled step, and what does it cost the step?

With ``cpp_wrapper`` (what ``rlaccel_plugins.fused.compiled_step.OPTIONS`` sets) inductor writes the wrapper and
the kernels into one C++ file built at ``-O3``; most of a cold compile is gcc on that file. Built apart, the
wrapper (glue: argument parsing, allocations, calls) is built at ``-O1`` and the kernels at ``-O3``. Each
setting runs in a new process with empty compile caches: SB3 SAC on Pendulum-v1 (RL Zoo's settings, one step
per call) and SB3 DQN on CartPole-v1 (RL Zoo's settings, a call's 128 steps as one compiled loop), the first
call timed (trace, compile, load), then 8 calls timed, in ms per gradient step. The settings alternate over
``--rounds`` rounds.

Usage:
    python -m benchmarks.investigations.wrapper_build [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {"sac": ("SAC", "Pendulum-v1", 1, 256), "dqn": ("DQN", "CartPole-v1", 128, 64)}


def one(case: str, separate: bool) -> dict[str, float]:
    """In this process (its caches empty): the first compiled call's seconds and the steady ms per step."""
    import stable_baselines3
    import torch
    from rlaccel_sb3.fused import fused_train_for
    from rlaccel_sb3.train import zoo_settings

    from rlaccel_plugins.fused import compiled_step

    compiled_step.OPTIONS["cpp_wrapper_build_separate"] = separate
    algo, env_id, steps, batch = CASES[case]
    settings = zoo_settings(algo.lower(), env_id)
    settings.pop("n_timesteps", None)
    settings["learning_starts"] = 1000
    model = getattr(stable_baselines3, algo)("MlpPolicy", env_id, seed=0, device="cpu", **settings)
    model.learn(1300)
    torch.set_num_threads(2)
    train = fused_train_for(model, compiled=True)
    start = time.perf_counter()
    train(steps, batch)
    first = time.perf_counter() - start
    times = []
    for _ in range(8):
        start = time.perf_counter()
        train(steps, batch)
        times.append(time.perf_counter() - start)
    return {"first_call_s": first, "ms_per_step": 1e3 * statistics.median(times) / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("CASE", "SEPARATE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1] == "1")))
        return
    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for case in CASES:
            for separate in ((False, True) if r % 2 == 0 else (True, False)):
                with tempfile.TemporaryDirectory() as cache:
                    env = {**os.environ, "RLACCEL_CACHE_DIR": os.path.join(cache, "rlaccel"),
                           "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
                    out = subprocess.run([sys.executable, "-m", "benchmarks.investigations.wrapper_build", "--one", case,
                                          "1" if separate else "0"], env=env, capture_output=True, text=True, check=True)
                results.setdefault((case, separate), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(case, "separate" if separate else "one file", results[(case, separate)][-1], flush=True)
    print(f"{'case':<5} {'wrapper':<10} {'first call s':>14} {'ms per step':>12}")
    for (case, separate), runs in results.items():
        first = statistics.median(r["first_call_s"] for r in runs)
        ms = statistics.median(r["ms_per_step"] for r in runs)
        print(f"{case:<5} {'separate' if separate else 'one file':<10} {first:>14.1f} {ms:>12.3f}")


if __name__ == "__main__":
    main()
