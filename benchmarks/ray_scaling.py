"""Ray scale-out: collection throughput with 1, 2, 4 actors vs the single-process path, same run.

Every variant collects CartPole-v1 with an SB3 DQN policy (epsilon 0.05, ``--envs-per-actor`` envs per
actor) into the tiered buffer through SB3's own per-step bookkeeping, with no gradient steps, so what
is measured is collection + transfer + storing. The single-process path is SB3's own ``model.learn``
with the same envs. Steady state: counted from the first chunk received (actor start-up, one process
per actor, is reported separately). The per-transition overhead of the Ray path is the learner's time
per stored transition with Ray minus without.

    python -m benchmarks.ray_scaling --steps 40000 --actors 1,2,4
    python -m benchmarks.ray_scaling --learn-seeds 3     # also: DQN to 475, one machine vs 2 Ray actors

Writes ``ray_scaling.json`` (what the results index reads) and ``results.md`` (the tables) to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from benchmarks import _results


def _model(n_envs: int):
    from rlaccel_sb3 import TieredReplayBuffer
    from rlaccel_sb3.envs import make_env
    from stable_baselines3 import DQN

    # learning_starts=0: the policy acts (batched inference) from the first step; gradient_steps=0: no updates
    model = DQN("MlpPolicy", make_env("CartPole-v1", n_envs, 0, accelerated=True), learning_starts=0,
                exploration_initial_eps=0.05, exploration_final_eps=0.05, train_freq=1, gradient_steps=0, seed=0,
                replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="classic_control"))
    return model


def single_process(steps: int, n_envs: int) -> dict:
    from stable_baselines3.common.callbacks import BaseCallback

    model = _model(n_envs)
    marks = {}

    class Clock(BaseCallback):
        def _on_step(self) -> bool:
            marks.setdefault("start", (time.perf_counter(), self.num_timesteps))
            return True

    model.learn(steps, callback=Clock())
    end = time.perf_counter()
    start, at = marks["start"]
    return {"variant": f"single process ({n_envs} envs)", "env_steps_per_s": (model.num_timesteps - at) / (end - start),
            "startup_s": 0.0}


def with_ray(steps: int, n_envs: int, actors: int, chunk_steps: int) -> dict:
    from rlaccel_sb3.ray_learn import learn_ray

    model = _model(n_envs)
    marks = {}
    begin = time.perf_counter()

    def first_chunk(metrics):
        marks.setdefault("start", (time.perf_counter(), model.num_timesteps))

    run = learn_ray(model, steps, "CartPole-v1", actors=actors, chunk_steps=chunk_steps, on_metrics=first_chunk,
                    log_every=1)
    end = time.perf_counter()
    start, at = marks["start"]
    return {"variant": f"ray, {actors} actor{'s' if actors > 1 else ''} x {n_envs} envs",
            "env_steps_per_s": (model.num_timesteps - at) / (end - start), "startup_s": start - begin,
            "actor_env_steps_per_s": run.metrics["ray/env_steps_per_s"],
            "chunk_latency_ms": run.metrics["ray/chunk_latency_ms"]}


def time_to_475(seed: int, actors: int | None) -> dict:
    """`rlaccel train` (SB3 DQN, classic_control, 4 envs) to a 475 evaluation, on one machine or on Ray."""
    import rlaccel_plugins as rla
    from rlaccel_plugins.parallel.ray_actors import ray_settings
    from rlaccel_plugins.training import TrainSpec, run_training

    spec = TrainSpec(framework="sb3", algo="dqn", env_id="CartPole-v1", seed=seed, steps=60_000, progress=False,
                     config=rla.load_config(preset="classic_control", parallel_envs=4), eval_freq=1_000,
                     ray=ray_settings(actors=actors) if actors else None)
    result = run_training(spec)
    seconds, steps = result.time_to_threshold(475)
    return {"variant": f"ray, {actors} actors x 4 envs" if actors else "one machine (4 envs)", "seed": seed,
            "seconds": seconds, "env_steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--actors", default="1,2,4")
    parser.add_argument("--envs-per-actor", type=int, default=4)
    parser.add_argument("--chunk-steps", type=int, default=16)
    parser.add_argument("--learn-seeds", type=int, default=0, help="also time DQN to 475 (one machine vs 2 actors)")
    parser.add_argument("--out", default="benchmarks/results/ray_scaling")
    args = parser.parse_args()

    from rlaccel_plugins.parallel.ray_actors import connect

    connect(None, num_cpus=os.cpu_count())
    rows = [single_process(args.steps, args.envs_per_actor)]
    for actors in [int(a) for a in args.actors.split(",")]:
        rows.append(with_ray(args.steps, args.envs_per_actor, actors, args.chunk_steps))
    base = rows[0]["env_steps_per_s"]
    overhead_us = 1e6 * (1 / rows[1]["env_steps_per_s"] - 1 / base) if len(rows) > 1 else None
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}"
    lines = [(f"Ray scaling, CartPole-v1 collection into the tiered buffer, {args.steps:,} env steps per variant "
              f"({machine}):"), "",
             "| variant | env steps/s (steady) | vs single process | actor start-up s | chunk latency ms |",
             "|---|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['variant']} | {row['env_steps_per_s']:,.0f} | {row['env_steps_per_s'] / base:.2f}x | "
                     f"{row['startup_s']:.1f} | {row.get('chunk_latency_ms', 0):.1f} |")
    if overhead_us is not None:
        lines += ["", f"Per-transition overhead of the Ray path (1 actor vs single process): {overhead_us:+.1f} µs"]
    learn = [time_to_475(seed, actors) for seed in range(args.learn_seeds) for actors in (None, 2)]
    if learn:
        import statistics

        lines += ["", ("SB3 DQN rlaccel[classic_control] to a 475 evaluation (training time includes the actors' "
                       "start-up):"), "", "| variant | reached | median time | median env steps |", "|---|---:|---:|---:|"]
        for name in dict.fromkeys(r["variant"] for r in learn):
            runs = [r for r in learn if r["variant"] == name and r["seconds"] is not None]
            n = sum(r["variant"] == name for r in learn)
            median = (f"{statistics.median(r['seconds'] for r in runs):.1f} s | "
                      f"{statistics.median(r['env_steps'] for r in runs):,.0f}") if runs else "— | —"
            lines.append(f"| {name} | {len(runs)}/{n} | {median} |")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    best = max(rows[1:] or rows, key=lambda row: row["env_steps_per_s"])
    _results.write(str(out), "ray_scaling", rows=rows, learn=learn, overhead_us_per_transition=overhead_us,
                   headline=f"{best['variant']}: {best['env_steps_per_s'] / base:.2f}x the single process's collection rate")


if __name__ == "__main__":
    main()
