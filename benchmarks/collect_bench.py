"""Collection throughput on Atari Pong: raw envpool vs the collection path (envpool / gymnasium +
batched NatureCNN inference), same run.

- ``raw envpool``      — random actions, no inference: the physical limit of this machine
- ``envpool + CNN``    — SB3 ``EnvPoolVecEnv(sb3_atari=True)`` and one batched forward of SB3's
  NatureCNN DQN policy for all envs per step (what ``rlaccel train`` runs to collect)
- ``gymnasium + CNN``  — gymnasium's async vector env with ``AtariPreprocessing`` + 4-frame stack,
  same inference

Agent steps per second (frames/s = 4x). Usage:
    python benchmarks/collect_bench.py [--envs 8] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def raw_envpool(envs: int, steps: int) -> float:
    import envpool

    pool = envpool.make_gymnasium("Pong-v5", num_envs=envs, seed=0)
    pool.reset()
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps):
        pool.step(rng.integers(0, 6, envs))
    return steps * envs / (time.perf_counter() - start)


def policy_for(observation_space, action_space):
    from stable_baselines3.dqn.policies import CnnPolicy

    return CnnPolicy(observation_space, action_space, lr_schedule=lambda _: 1e-4)


def inference_only(envs: int, steps: int) -> float:
    """Batched NatureCNN forwards on stored observations, no env: the other half of the CPU bill."""
    import gymnasium as gym

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    policy = policy_for(space, gym.spaces.Discrete(6))
    obs = np.random.default_rng(0).integers(0, 256, (envs, 4, 84, 84), dtype=np.uint8)
    start = time.perf_counter()
    for _ in range(steps):
        policy.predict(obs, deterministic=True)
    return steps * envs / (time.perf_counter() - start)


def envpool_with_inference(envs: int, steps: int) -> float:
    from rlaccel_sb3 import EnvPoolVecEnv

    venv = EnvPoolVecEnv("Pong-v5", num_envs=envs, seed=0, sb3_atari=True)
    policy = policy_for(venv.observation_space, venv.action_space)
    obs = venv.reset()
    start = time.perf_counter()
    for _ in range(steps):
        actions, _ = policy.predict(obs, deterministic=True)
        obs, _, _, _ = venv.step(actions)
    return steps * envs / (time.perf_counter() - start)


def gymnasium_with_inference(envs: int, steps: int) -> float:
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)

    def make():
        env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
        return FrameStackObservation(AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84), 4)

    venv = gym.vector.AsyncVectorEnv([make for _ in range(envs)])
    policy = policy_for(venv.single_observation_space, venv.single_action_space)
    obs, _ = venv.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        actions, _ = policy.predict(obs, deterministic=True)
        obs, _, _, _, _ = venv.step(actions)
    rate = steps * envs / (time.perf_counter() - start)
    venv.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1000, help="vector steps per measurement")
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    results = {"raw envpool": raw_envpool(args.envs, args.steps),
               "CNN inference only": inference_only(args.envs, args.steps),
               "envpool + CNN": envpool_with_inference(args.envs, args.steps),
               "gymnasium + CNN": gymnasium_with_inference(args.envs, args.steps)}
    raw, inference = results["raw envpool"], results["CNN inference only"]
    # Emulation and inference share the same cores, so their CPU times add up: this is the best any
    # collection path can do here without more cores (or a GPU) for the inference.
    results["ceiling on these cores"] = 1 / (1 / raw + 1 / inference)
    print(f"Pong, {args.envs} envs, {args.steps} vector steps each, torch threads {torch.get_num_threads()}")
    for name, rate in results.items():
        print(f"  {name:<22} {rate:9,.0f} agent steps/s  ({rate * 4:,.0f} frames/s)  {rate / raw:6.1%} of raw envpool")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
