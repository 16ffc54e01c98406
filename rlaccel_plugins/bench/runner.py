"""Run a suite: every (seed, task, variant) in a fresh process, interleaved so noise hits all alike."""

from __future__ import annotations

import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from typing import Any

from rlaccel_plugins.bench.processes import process_context, with_environment
from rlaccel_plugins.bench.suites import UNIFORM_REPLAY, Task, Variant
from rlaccel_plugins.tasks import task_info


def variant_config(variant: Variant):
    """The AccelConfig a variant trains with (its preset plus overrides)."""
    from rlaccel_plugins.loader import load_config

    overrides = dict(variant.overrides)
    if overrides.pop(UNIFORM_REPLAY, False):
        capacity = load_config(preset=variant.preset).replay_buffer.capacity
        overrides.update(levels=1, level_capacity=[capacity], sampling_ratio=[1.0])
    return load_config(preset=variant.preset, **overrides)


def run_one(task: Task, variant: Variant, seed: int) -> dict[str, Any]:
    """Train one variant on one task and seed in this process; a JSON-ready record."""
    from rlaccel_plugins.training import TrainSpec, run_training

    steps = variant.steps or task.steps
    config = variant_config(variant)
    hyperparams = dict(variant.hyperparams)
    spec = TrainSpec(framework=variant.framework, algo=variant.algo, env_id=task.env_id,
                     config=config, steps=steps, seed=seed, stock=variant.stock, dropin=variant.dropin,
                     eval_freq=task.eval_freq, progress=False, hyperparams=hyperparams,
                     stop_at=float("inf") if task.fixed_steps else None)
    started = time.perf_counter()
    result = run_training(spec)
    threshold = task_info(task.env_id).threshold
    seconds, env_steps = result.time_to_threshold(threshold)
    train = max(result.train_seconds, 1e-9)
    return {"task": task.env_id, "variant": variant.name, "role": variant.role, "seed": seed, "cap": steps,
            "threshold": threshold, "seconds_to_threshold": seconds, "steps_to_threshold": env_steps,
            "final_eval": result.final_eval, "env_steps": result.env_steps, "train_seconds": result.train_seconds,
            "env_steps_per_s": result.env_steps / train,
            "gradient_steps": result.gradient_steps, "gradient_steps_per_s": result.gradient_steps / train,
            "replay_bytes_per_transition": result.replay_bytes_per_transition,
            "replay_sampling": result.replay_sampling,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "wall_seconds": time.perf_counter() - started,
            "curve": [asdict(p) for p in result.curve], "stats": result.stats}


def run_isolated(task: Task, variant: Variant, seed: int) -> dict[str, Any]:
    """:func:`run_one` in a fresh process (peak RSS and torch state are then the run's own)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=process_context()) as pool:
        return pool.submit(with_environment, dict(os.environ), run_one, task, variant, seed).result()


def raw_env_steps_per_s(env_id: str, seconds: float = 3.0) -> dict[str, Any]:
    """The physical limit: random-action env steps/s of the fastest backend here (no learning)."""
    import numpy as np

    from rlaccel_plugins.hardware import cpu_count
    from rlaccel_plugins.parallel.factory import choose_backend, make_vec_env

    backend = choose_backend(env_id, "auto")
    num_envs = 4 * cpu_count()
    env = make_vec_env(env_id, num_envs=num_envs, backend=backend, seed=0)
    env.reset()
    space = env.single_action_space if hasattr(env, "single_action_space") else env.action_space
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(np.array([space.sample() for _ in range(num_envs)]) if not hasattr(space, "n")
                 else rng.integers(0, space.n, num_envs))
        steps += num_envs
    rate = steps / (time.perf_counter() - start)
    env.close()
    return {"backend": backend, "num_envs": num_envs, "env_steps_per_s": rate}


PROBE_SECONDS = 1.0  # each host probe: the raw env rate over this long, before every seed and at the end


def run_suite(tasks: tuple[Task, ...], seeds: int, first_seed: int = 0, isolated: bool = True,
              on_record=None) -> dict[str, Any]:
    """Every variant of every task for ``seeds`` seeds, interleaved (seed-major: A B C, A B C, ...), with
    how steady the host was meanwhile (:mod:`rlaccel_plugins.bench.host`)."""
    from rlaccel_plugins.bench.host import HostMeter

    run = run_isolated if isolated else run_one
    records: list[dict[str, Any]] = []
    meter = HostMeter()
    raw = {task.env_id: raw_env_steps_per_s(task.env_id) for task in tasks}

    def probe() -> None:  # the host's speed now, by the first task's raw env rate
        if tasks:
            meter.probe(raw_env_steps_per_s(tasks[0].env_id, seconds=PROBE_SECONDS)["env_steps_per_s"])

    for seed in range(first_seed, first_seed + seeds):
        probe()
        for task in tasks:
            for variant in task.variants:
                record = run(task, variant, seed)
                records.append(record)
                if on_record is not None:
                    on_record(record)
    probe()
    return {"raw_env_steps_per_s": raw, "records": records, "host": meter.finish()}


def run_bench(suite: str, seeds: int = 5, frameworks: tuple[str, ...] = ("sb3", "tianshou"), out: str = "bench-results",
              ablate: bool = False, first_seed: int = 0, steps: int | None = None,
              preset: str | None = None) -> dict[str, Any]:
    """`rlaccel bench`: run ``suite``, print each run as it ends, write results.json, results.md and plots."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from rlaccel_plugins.bench import report
    from rlaccel_plugins.bench.suites import get_suite
    from rlaccel_plugins.errors import invalid

    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise invalid("seeds", "be a positive integer", seeds)
    tasks = get_suite(suite, frameworks, ablate, preset)
    for task in tasks:
        if task.missing():
            print(f"skipping {task.env_id}: {task.missing()}", flush=True)
    tasks = tuple(task for task in tasks if not task.missing())
    if steps is not None:
        tasks = tuple(replace(t, steps=steps, variants=tuple(replace(v, steps=None) for v in t.variants))
                      for t in tasks)

    def show(record: dict[str, Any]) -> None:
        done = (f"reached {record['threshold']:g} after {record['seconds_to_threshold']:.1f} s / "
                f"{record['steps_to_threshold']:,} env steps" if record["seconds_to_threshold"] is not None
                else f"not reached within {record['env_steps']:,} env steps ({record['train_seconds']:.1f} s)")
        print(f"[seed {record['seed']}] {record['task']} {record['variant']}: {done}; "
              f"{record['env_steps_per_s']:,.0f} env steps/s", flush=True)

    raw = run_suite(tasks, seeds, first_seed=first_seed, on_record=show)
    command = (f"rlaccel bench --suite {suite} --seeds {seeds} --frameworks {','.join(frameworks)}"
               + (" --ablate" if ablate else "") + (f" --first-seed {first_seed}" if first_seed else "")
               + (f" --steps {steps}" if steps is not None else "") + (f" --preset {preset}" if preset else "")
               + f" --out {out}")
    results = {"suite": suite, "seeds": seeds, "command": command, "date": time.strftime("%Y-%m-%d"),
               "machine": report.machine(),
               "thresholds": {t.env_id: task_info(t.env_id).threshold for t in tasks}, **raw}
    results["summary"] = report.summarize(results["records"])
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = report.markdown(results)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out_dir / "results.md").write_text(table)
    plots = report.plot(results["records"], results["thresholds"], out_dir)
    print("\n" + table)
    print(f"written: {out_dir / 'results.json'}, {out_dir / 'results.md'}, " + ", ".join(str(p) for p in plots))
    return results
