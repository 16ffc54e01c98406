"""Gradient steps per second on a CUDA device: SB3's own ``train()``, rlaccel's fused one run eagerly,
and the fused one captured in CUDA graphs (what ``AccelerateCallback`` installs on a GPU).

Interleaved rounds on the same model and buffer contents, synchronised before each clock read:
DQN, SAC and TD3 with 256-256 MLPs at batch 256 (CartPole / Pendulum transitions), and DQN with SB3's
NatureCNN on Atari-shaped frames (4x84x84 uint8) at batch 32 and 512. The frames are random: what a
step costs does not depend on what the pixels show.

End to end (``--learn``): ``model.learn()`` wall time with SB3 alone and with
``AccelerateCallback(sparse=False)`` (fused updates + the guard, the same math: no sparse phases), on RL
Zoo's CartPole DQN settings (20k env steps, 128 gradient steps every 256) and Pendulum SAC (3k env
steps, one gradient step per env step) and CartPole PPO (16k env steps: 8 envs x 32 steps, 20 epochs;
no CUDA graphs for PPO — its fused ``train()`` runs eagerly — but lean collection), same seed.

Usage (on a machine with a GPU; ``benchmarks/gpu_check.sh`` runs it):
    python -m benchmarks.gpu_bench [--steps 100] [--rounds 5] [--learn] [--out FOLDER]
"""

from __future__ import annotations

import argparse
import copy
import time
from functools import partial

import numpy as np
import torch

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved, medians


def frames_env():
    """A gymnasium env with Atari's observation layout after SB3's wrappers (4x84x84 uint8), 6 actions."""
    import gymnasium as gym

    class Frames(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        action_space = gym.spaces.Discrete(6)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, bool(self.np_random.random() < 0.01), False, {}

    return Frames()


def build(case: str):
    from stable_baselines3 import DQN

    from benchmarks.fused_bench import build as build_mlp

    if case == "cnn-dqn":
        model = DQN("CnnPolicy", frames_env(), buffer_size=4_000, learning_starts=100_000, seed=0, device="cuda",
                    optimize_memory_usage=False)
        model.learn(3_000)
        return model
    return build_mlp(case, (256, 256), device="cuda")


def timed(train, steps: int, batch: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    train(steps, batch)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="gradient steps per timed call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="dqn:256,sac:256,td3:256,cnn-dqn:32,cnn-dqn:512")
    parser.add_argument("--learn", action="store_true", help="also time learn() end to end")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    from rlaccel_sb3.fused import fused_train_for

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; ms per gradient step, median of "
          f"{args.rounds} interleaved rounds of {args.steps} steps")
    print(f"{'case':<14} {'batch':>5} {'stock':>7} {'eager':>7} {'graphs':>7} {'graphs vs stock (steps/s)':>26}")
    rows = []
    for case in args.cases.split(","):
        name, batch = case.split(":")
        batch = int(batch)
        models = {"stock": build(name), "eager": build(name), "graphs": build(name)}
        trains = {"stock": models["stock"].train, "eager": fused_train_for(models["eager"], cuda_graphs=False),
                  "graphs": fused_train_for(models["graphs"])}
        for train in trains.values():  # warm-up, the graphs' capture included
            train(8, batch)
        graphs = trains["graphs"].graphs
        times = interleaved({key: partial(timed, train, args.steps, batch) for key, train in trains.items()},
                            args.rounds, alternate=True)
        ms = {k: 1e3 * v / args.steps for k, v in medians(times).items()}
        note = f"  ({graphs.captured} graphs)" if graphs.steps.enabled else f"  (eager: {graphs.reason})"
        print(f"{name:<14} {batch:>5} {ms['stock']:>7.3f} {ms['eager']:>7.3f} {ms['graphs']:>7.3f} "
              f"{ms['stock'] / ms['graphs']:>25.2f}x{note}", flush=True)
        rows.append({"case": name, "batch": batch, **{f"{key}_ms": value for key, value in ms.items()},
                     "graphs_speed_vs_stock": ms["stock"] / ms["graphs"], "graphs": note.strip(" ()")})
        for train in trains.values():
            getattr(train, "release", lambda: None)()
        del models, trains
        torch.cuda.empty_cache()
    learned = learn_rows() if args.learn else []
    headline = next((f"SAC 256-256 gradient steps on {torch.cuda.get_device_name()}, CUDA graphs: "
                     f"{row['graphs_speed_vs_stock']:.2f}x SB3's speed" for row in rows if row["case"] == "sac"),
                    "no SAC case run")
    _results.write(args.out, "gpu_bench", rows=rows + learned, headline=headline, device=torch.cuda.get_device_name())


def learn_rows() -> list[dict]:
    from rlaccel_sb3 import AccelerateCallback
    from rlaccel_sb3.train import zoo_settings
    from stable_baselines3 import DQN, PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env

    def zoo(cls, algo: str, env_id: str, **extra):
        """``cls`` at RL Zoo's settings for the task (rlaccel_sb3.train.ZOO), seed 0, on the GPU."""
        settings = zoo_settings(algo, env_id)
        settings.pop("n_timesteps")
        n_envs = settings.pop("n_envs", 1)
        return lambda: cls("MlpPolicy", make_vec_env(env_id, n_envs=n_envs, seed=0) if n_envs > 1 else env_id,
                           **copy.deepcopy(settings), **extra, seed=0, device="cuda")

    cases = {
        "DQN CartPole (RL Zoo)": (zoo(DQN, "dqn", "CartPole-v1"), 20_000),
        "SAC Pendulum (RL Zoo)": (zoo(SAC, "sac", "Pendulum-v1", learning_starts=100), 3_000),
        "PPO CartPole (RL Zoo)": (zoo(PPO, "ppo", "CartPole-v1"), 16_384),
    }
    print(f"\n{'learn() end to end':<24} {'env steps':>9} {'stock s':>8} {'rlaccel s':>9} {'speed-up':>8}")
    rows = []
    for name, (make, steps) in cases.items():
        seconds = {}
        for variant in ("stock", "rlaccel"):
            model = make()
            callback = AccelerateCallback(sparse=False) if variant == "rlaccel" else None
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.learn(steps, callback=callback)
            torch.cuda.synchronize()
            seconds[variant] = time.perf_counter() - start
        print(f"{name:<24} {steps:>9} {seconds['stock']:>8.1f} {seconds['rlaccel']:>9.1f} "
              f"{seconds['stock'] / seconds['rlaccel']:>7.2f}x", flush=True)
        rows.append({"case": f"learn(): {name}", "env_steps": steps, "stock_s": seconds["stock"],
                     "rlaccel_s": seconds["rlaccel"], "speed_vs_stock": seconds["stock"] / seconds["rlaccel"]})
    return rows


if __name__ == "__main__":
    main()
