"""Collection throughput on Atari Pong: raw envpool vs the collection path (envpool / gymnasium +
batched NatureCNN inference), same run.

- ``raw envpool``      — random actions, no inference, envpool configured as the collection rows'
  ``EnvPoolVecEnv(sb3_atari=True)`` configures it: the physical limit of this machine
- ``envpool + CNN``    — SB3 ``EnvPoolVecEnv(sb3_atari=True)`` and one batched forward of SB3's
  NatureCNN DQN policy for all envs per step (what ``rlaccel train`` runs to collect)
- ``gymnasium + CNN``  — gymnasium's async vector env with ``AtariPreprocessing`` + 4-frame stack,
  same inference

Agent steps per second (frames/s = 4x).

``--framework``: SB3's off-policy collection on CartPole-v1 (DQN, RL Zoo settings: ``learn()`` with no
gradient step, epsilon-greedy past ``learning_starts``), µs per env step, interleaved rounds:

- ``stock``  — SB3's own ``collect_rollouts``;
- ``lean``   — the same with rlaccel's lean ``collect_rollouts``, ``_sample_action``,
  ``_store_transition`` and ``_on_step`` (what ``AccelerateCallback`` installs);
- ``floor``  — the same VecEnv's step, one forward of the same Q-network on the observation as a
  tensor, and one write of the transition into preallocated arrays, hand-written: what is left once
  the framework's loop is gone;
- ``+target`` — the floor plus DQN's target-network update at its cadence (a Polyak update of the
  256-256 Q-network every ``target_update_interval // n_envs`` vector steps, as the multi-tensor
  kernels the lean path runs): part of DQN's collection, not of the issue's floor;

with 1 gymnasium env (``DummyVecEnv``) and 16 envpool envs (``EnvPoolVecEnv``); and SB3 PPO's
``collect_rollouts`` with RL Zoo's CartPole settings (8 envs x 32 steps): stock, lean (rlaccel's policy
``forward``), and a floor (the env step, one forward of the same two MLPs and the categorical draw, one
write of the step into preallocated arrays); and Tianshou's ``Collector`` against rlaccel's
``LeanCollector`` with the DQN example's settings (10 envs, 128-128-128 net, eps 0.1), floor = the same
envs' step with resets, one forward and one write: in one ``collect`` call of 5,000 steps, and in
``collect(n_step=10)`` calls as the example's trainer makes them (each call also pays ``collect``'s own
work: the policy's train/eval switch and the statistics' summaries).

``--split``: how to divide this machine's cores between emulation and batched NatureCNN inference on
Pong (``EnvPoolVecEnv(sb3_atari=True)``): agent steps/s for envpool worker threads x torch threads,
with SB3's ``policy.predict`` and with a lean forward (``torch.inference_mode``, the Q-network called
directly on the uint8 frames, ``argmax``): as it is, ``torch.compile``-d, or in channels-last.

Usage:
    python -m benchmarks.collect_bench [--envs 8] [--steps 2000] [--out benchmarks/results/collect-pong]
    python -m benchmarks.collect_bench --framework [--rounds 5]
    python -m benchmarks.collect_bench --split [--envs 8] [--steps 300]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np
import torch

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved, medians


def raw_envpool(envs: int, steps: int) -> float:
    """envpool's own ``step`` with random actions, in the configuration the collection rows run
    (``EnvPoolVecEnv(sb3_atari=True)``: SB3's Atari settings, rlaccel's worker-thread count)."""
    import envpool
    from rlaccel_sb3.envpool_vec_env import SB3_ATARI_OPTIONS

    from rlaccel_plugins.parallel.factory import envpool_threads

    pool = envpool.make_gymnasium("Pong-v5", num_envs=envs, seed=0, num_threads=envpool_threads("Pong-v5", envs),
                                  **SB3_ATARI_OPTIONS)
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


def split_rows(envs: int, steps: int) -> list[dict]:
    """Agent steps/s of envpool + batched NatureCNN inference per (envpool threads, torch threads, path);
    the compiled path's ``torch.compile`` warm-up runs before the cells and is printed on its own."""
    from rlaccel_sb3 import EnvPoolVecEnv

    paths = ("predict", "lean", "compiled", "channels_last")
    rows = []
    print(f"Pong, {envs} envs, {steps} vector steps per cell; agent steps/s (frames/s = 4x)")
    print(f"  {'envpool thr':>11} {'torch thr':>9} {'SB3 predict':>12} {'lean':>8} {'lean, compiled':>15} "
          f"{'lean, channels-last':>20}")
    for pool_threads in (1, 2):
        venv = EnvPoolVecEnv("Pong-v5", num_envs=envs, seed=0, sb3_atari=True, num_threads=pool_threads)
        policy = policy_for(venv.observation_space, venv.action_space)
        policy.set_training_mode(False)
        q_net = policy.q_net
        # SB3's preprocessing (uint8 frames as float / 255) written out: dynamo's guards on SB3's
        # `preprocess_obs` (it reads the numpy space) fail under inference_mode in torch 2.13
        compiled = torch.compile(lambda frames, net=q_net: net.q_net(net.features_extractor(frames.float() / 255.0)))
        start = time.perf_counter()
        with torch.inference_mode():
            compiled(torch.as_tensor(venv.reset()))
        print(f"  (torch.compile warm-up: {time.perf_counter() - start:.1f} s)", flush=True)
        for torch_threads in (1, 2):
            torch.set_num_threads(torch_threads)
            rates = {}
            for name in paths:
                if name == "channels_last":
                    q_net.to(memory_format=torch.channels_last)
                forward = compiled if name == "compiled" else q_net
                obs = venv.reset()
                start = time.perf_counter()
                for _ in range(steps):
                    if name == "predict":
                        actions, _ = policy.predict(obs, deterministic=True)
                    else:
                        with torch.inference_mode():
                            frames = torch.as_tensor(obs)
                            if name == "channels_last":
                                frames = frames.contiguous(memory_format=torch.channels_last)
                            actions = forward(frames).argmax(dim=1).numpy()
                    obs, _, _, _ = venv.step(actions)
                rates[name] = steps * envs / (time.perf_counter() - start)
                if name == "channels_last":
                    q_net.to(memory_format=torch.contiguous_format)
            print(f"  {pool_threads:>11} {torch_threads:>9} {rates['predict']:>12,.0f} {rates['lean']:>8,.0f} "
                  f"{rates['compiled']:>15,.0f} {rates['channels_last']:>20,.0f}", flush=True)
            rows.append({"envpool_threads": pool_threads, "torch_threads": torch_threads,
                         **{f"{name}_agent_steps_per_s": rate for name, rate in rates.items()}})
        venv.close()
    return rows


def _dqn(venv):
    from rlaccel_sb3.train import zoo_settings
    from stable_baselines3 import DQN

    settings = zoo_settings("dqn", "CartPole-v1")
    settings.pop("n_timesteps")
    settings.update(learning_starts=0, gradient_steps=0, exploration_fraction=1e-9, exploration_final_eps=0.05)
    return DQN("MlpPolicy", venv, seed=0, device="cpu", **settings)


def sb3_collection_us(make_env, steps: int, lean: bool) -> float:
    from rlaccel_sb3.overrides import override_method
    from rlaccel_sb3.rollouts import lean_off_policy_methods

    model = _dqn(make_env())
    for name, method in (lean_off_policy_methods(model) if lean else {}).items():
        override_method(model, name, method)
    model.learn(1_000)  # warm-up
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return 1e6 * (time.perf_counter() - start) / steps


def floor_us(make_env, steps: int, target_update: bool = False) -> float:
    """Env step + one Q-network forward + one transition write, by hand (no framework loop); with
    ``target_update``, DQN's Polyak update of the target network at its cadence too."""
    from rlaccel_plugins.fused import polyak_update_

    venv = make_env()
    model = _dqn(venv)
    q_net, n = model.policy.q_net.q_net, venv.num_envs
    online, target = list(model.q_net.parameters()), list(model.q_net_target.parameters())
    every = max(model.target_update_interval // n, 1) if target_update else 0
    obs = venv.reset()
    rows = steps // n + 1
    stored = {"obs": np.zeros((rows, n, 4), np.float32), "next_obs": np.zeros((rows, n, 4), np.float32),
              "action": np.zeros((rows, n), np.int64), "reward": np.zeros((rows, n), np.float32),
              "done": np.zeros((rows, n), np.float32)}
    start = time.perf_counter()
    with torch.no_grad():
        for row in range(steps // n):
            actions = q_net(torch.as_tensor(obs)).argmax(dim=1).numpy()
            next_obs, rewards, dones, _ = venv.step(actions)
            stored["obs"][row], stored["next_obs"][row], stored["action"][row] = obs, next_obs, actions
            stored["reward"][row], stored["done"][row] = rewards, dones
            obs = next_obs
            if every and (row + 1) % every == 0:
                polyak_update_(online, target, model.tau)
    return 1e6 * (time.perf_counter() - start) / (steps // n * n)


def framework_rows(rounds: int, steps: int) -> list[dict]:
    from stable_baselines3.common.env_util import make_vec_env

    def gym1():
        return make_vec_env("CartPole-v1", n_envs=1, seed=0)

    def pool16():
        from rlaccel_sb3 import EnvPoolVecEnv

        return EnvPoolVecEnv("CartPole-v1", num_envs=16, seed=0)

    print(f"SB3 DQN collection on CartPole-v1 (RL Zoo settings, no updates), us per env step, median of {rounds} "
          f"interleaved rounds of {steps} env steps; torch threads {torch.get_num_threads()}")
    print(f"  {'envs':<18} {'stock':>7} {'lean':>7} {'floor':>7} {'+target':>7} {'lean/stock':>10} "
          f"{'lean/floor':>10} {'lean/+target':>12}")
    rows = []
    for name, make_env, n_steps in (("1 gymnasium", gym1, steps), ("16 envpool", pool16, 8 * steps)):
        us = medians(interleaved({"stock": partial(sb3_collection_us, make_env, n_steps, lean=False),
                                  "lean": partial(sb3_collection_us, make_env, n_steps, lean=True),
                                  "floor": partial(floor_us, make_env, n_steps),
                                  "+target": partial(floor_us, make_env, n_steps, target_update=True)},
                                 rounds, alternate=True))
        print(f"  {name:<18} {us['stock']:>7.1f} {us['lean']:>7.1f} {us['floor']:>7.1f} {us['+target']:>7.1f} "
              f"{us['lean'] / us['stock']:>9.2f}x {us['lean'] / us['floor']:>9.2f}x "
              f"{us['lean'] / us['+target']:>11.2f}x", flush=True)
        rows.append({"case": f"SB3 DQN, {name}", **_us_row(us)})
    return rows


def _us_row(us: dict[str, float]) -> dict[str, float]:
    return {**{f"{name}_us": value for name, value in us.items()}, "lean_vs_stock": us["lean"] / us["stock"],
            "lean_vs_floor": us["lean"] / us["floor"]}


def _ppo():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    return PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=0), n_steps=32, batch_size=256,
               gae_lambda=0.8, gamma=0.98, n_epochs=20, learning_rate=1e-3, seed=0, device="cpu")


def ppo_rollout_us(rollouts: int, lean: bool) -> float:
    from rlaccel_sb3.flat_actor_critic import lean_policy_forward_for
    from rlaccel_sb3.overrides import override_policy_forward

    model = _ppo()
    if lean:
        override_policy_forward(model.policy, lean_policy_forward_for(model))
    _, callback = model._setup_learn(total_timesteps=10**9, callback=None)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)  # warm-up
    start = time.perf_counter()
    for _ in range(rollouts):
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
    return 1e6 * (time.perf_counter() - start) / (rollouts * model.n_steps * model.n_envs)


def ppo_floor_us(rollouts: int) -> float:
    """The env step, the two MLPs and the categorical draw, and one write per vector step, by hand."""
    from rlaccel_sb3.flat_actor_critic import lean_policy_forward_for

    model = _ppo()
    forward, venv = lean_policy_forward_for(model), model.env
    obs, n, steps = venv.reset(), venv.num_envs, rollouts * model.n_steps
    stored = {k: np.zeros((model.n_steps, n), np.float32) for k in ("action", "reward", "value", "log_prob", "start")}
    observations = np.zeros((model.n_steps, n, 4), np.float32)
    start = time.perf_counter()
    with torch.no_grad():
        for step in range(steps):
            actions, values, log_probs = forward(torch.as_tensor(obs))
            actions = actions.numpy()
            new_obs, rewards, dones, _ = venv.step(actions)
            row = step % model.n_steps
            observations[row] = obs
            stored["action"][row], stored["reward"][row], stored["start"][row] = actions, rewards, dones
            stored["value"][row], stored["log_prob"][row] = values.numpy().ravel(), log_probs.numpy()
            obs = new_obs
    return 1e6 * (time.perf_counter() - start) / (steps * n)


def ppo_rows(rounds: int) -> list[dict]:
    us = medians(interleaved({"stock": partial(ppo_rollout_us, 20, lean=False),
                              "lean": partial(ppo_rollout_us, 20, lean=True), "floor": partial(ppo_floor_us, 20)},
                             rounds, alternate=True))
    print(f"  {'PPO, 8 gymnasium':<18} {us['stock']:>7.1f} {us['lean']:>7.1f} {us['floor']:>7.1f} {'':>7} "
          f"{us['lean'] / us['stock']:>9.2f}x {us['lean'] / us['floor']:>9.2f}x", flush=True)
    return [{"case": "SB3 PPO, 8 gymnasium", **_us_row(us)}]


def _tianshou_dqn():
    import gymnasium as gym
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net

    torch.manual_seed(0)
    policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[128, 128, 128]),
                                     action_space=gym.spaces.Discrete(2), eps_training=0.1)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(10)])
    return DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3), envs


def tianshou_collect_us(lean: bool, steps: int, per_call: int | None = None) -> float:
    """µs per env step of ``collect(n_step=per_call)`` calls (one call of ``steps`` without ``per_call``);
    the example's trainer collects 10 steps (one vector step) per call."""
    from rlaccel_tianshou import LeanCollector
    from tianshou.data import Collector, VectorReplayBuffer

    dqn, envs = _tianshou_dqn()
    collector = (LeanCollector if lean else Collector)(dqn, envs, VectorReplayBuffer(20_000, 10),
                                                      exploration_noise=True)
    collector.reset()
    collector.collect(n_step=1_000)
    per_call = per_call or steps
    start = time.perf_counter()
    for _ in range(steps // per_call):
        collector.collect(n_step=per_call)
    return 1e6 * (time.perf_counter() - start) / (steps // per_call * per_call)


def tianshou_floor_us(steps: int) -> float:
    dqn, envs = _tianshou_dqn()
    net, n = dqn.policy.model, 10
    obs, _ = envs.reset()
    stored = np.zeros((steps // n + 1, n, 4), np.float32)
    start = time.perf_counter()
    with torch.no_grad():
        for row in range(steps // n):
            actions = net(obs)[0].argmax(dim=1).numpy()
            next_obs, _, terminated, truncated, _ = envs.step(actions)
            stored[row] = obs
            done = np.flatnonzero(np.logical_or(terminated, truncated))
            if len(done):
                next_obs[done] = envs.reset(done)[0]
            obs = next_obs
    return 1e6 * (time.perf_counter() - start) / (steps // n * n)


def tianshou_rows(rounds: int) -> list[dict]:
    us = medians(interleaved({"stock": partial(tianshou_collect_us, False, 5_000),
                              "stock 10": partial(tianshou_collect_us, False, 3_000, per_call=10),
                              "lean": partial(tianshou_collect_us, True, 5_000),
                              "lean 10": partial(tianshou_collect_us, True, 3_000, per_call=10),
                              "floor": partial(tianshou_floor_us, 5_000)}, rounds, alternate=True))
    rows = []
    for label, stock, lean in (("Tianshou, 10 envs", "stock", "lean"), ("  10 steps a call", "stock 10", "lean 10")):
        print(f"  {label:<18} {us[stock]:>7.1f} {us[lean]:>7.1f} {us['floor']:>7.1f} {'':>7} "
              f"{us[lean] / us[stock]:>9.2f}x {us[lean] / us['floor']:>9.2f}x", flush=True)
        rows.append({"case": f"Tianshou DQN, 10 envs{', 10 steps a call' if stock == 'stock 10' else ''}",
                     **_us_row({"stock": us[stock], "lean": us[lean], "floor": us["floor"]})})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1000, help="vector steps per measurement")
    parser.add_argument("--framework", action="store_true", help="SB3 off-policy collection: stock, lean, floor")
    parser.add_argument("--rounds", type=int, default=5, help="--framework: interleaved rounds")
    parser.add_argument("--split", action="store_true", help="Pong: envpool threads x torch threads x inference path")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    if args.split:
        rows = split_rows(args.envs, args.steps)
        best = max(rows, key=lambda row: row["lean_agent_steps_per_s"])
        _results.write(args.out, "collect_bench", rows=rows, mode="split",
                       headline=(f"Pong, envpool + CNN, lean path: {best['lean_agent_steps_per_s']:,.0f} agent steps/s "
                                 f"({best['envpool_threads']} envpool, {best['torch_threads']} torch threads)"))
        return
    if args.framework:
        rows = framework_rows(args.rounds, max(args.steps, 4_000)) + ppo_rows(args.rounds) + tianshou_rows(args.rounds)
        _results.write(args.out, "collect_bench", rows=rows, mode="framework",
                       headline=f"{rows[0]['case']} collection: lean {rows[0]['lean_vs_stock']:.2f}x stock's time")
        return
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
    rows = [{"case": name, "agent_steps_per_s": rate, "of_raw_envpool": rate / raw} for name, rate in results.items()]
    _results.write(args.out, "collect_bench", rows=rows, mode="pong", envs=args.envs,
                   headline=(f"Pong, envpool + CNN: {results['envpool + CNN']:,.0f} agent steps/s, the shared-core "
                             f"ceiling {results['ceiling on these cores']:,.0f}"))


if __name__ == "__main__":
    main()
