"""The learning study: what each variant learns per env step, over many seeds, in parallel workers.

A study is tasks x variants x seeds of fixed-budget runs (no early stop, no timing): every run
trains its whole budget and records its evaluation curve. Runs execute in worker processes (one
torch thread each), each run in a process of its own, so a crashed run loses only itself. Every
finished run is appended as one JSON line to ``runs.jsonl`` (flushed and fsynced), so an
interrupted study resumes where it stopped (``resume=True`` skips the runs already there).

Since the fused updates and lean collection compute what the framework computes, bit for bit
(the equivalence tests), every drop-in variant's learning runs through its fastest equivalent
path, the drop-in itself; only ``stock`` runs the framework's own code.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from rlaccel_plugins.bench.processes import process_context, with_environment
from rlaccel_plugins.bench.suites import Variant, drop_in
from rlaccel_plugins.errors import ConfigError, did_you_mean

RUNS_FILE = "runs.jsonl"


@dataclass(frozen=True)
class StudyTask:
    """One task of a study: an algorithm on an env, a fixed budget, the variants compared on it.

    ``threshold`` is the normalised score's 1 (the random policy's return is its 0), and what
    env steps to threshold count to.
    """

    env_id: str
    framework: str
    algo: str
    budget: int
    eval_freq: int
    threshold: float
    variants: tuple[Variant, ...]
    requires: str | None = None

    @property
    def key(self) -> str:
        return f"{self.framework} {self.algo.upper()} {self.env_id}"

    def missing(self) -> str | None:
        """Why this task cannot run here, or None."""
        import importlib.util

        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"{self.env_id} needs the {self.requires!r} module"
        return None


# what the variants are called in every study table and plot
STOCK, UNIFORM, TIERS, NO_ARGUMENT = "stock", "drop-in, uniform (off)", "drop-in, tiers (preset)", "drop-in, no argument"
ERE, CER, ANNEAL = "drop-in + ERE", "drop-in + CER", "drop-in, tiers annealed"
COMPILED = "drop-in, uniform + compiled updates"  # training.compiled_updates: the learning check of a re-rounding
BASELINES = {STOCK: STOCK, UNIFORM: UNIFORM}  # what the other variants are compared against


def study_variants(framework: str, algo: str, preset: str, budget: int) -> tuple[Variant, ...]:
    """Stock; the drop-in with uniform sampling, with the task family's ``preset`` (tiers), with no
    argument (the article's default tiers scaled to the buffer); and the candidate schemes."""
    stock = Variant(STOCK, framework, algo=algo, stock=True, role="yardstick")
    variants = [
        stock,
        replace(drop_in(framework, "off", algo), name=UNIFORM),
        replace(drop_in(framework, preset, algo), name=TIERS),
        replace(drop_in(framework, "default", algo), name=NO_ARGUMENT),
        replace(drop_in(framework, "off", algo, sampling="ere", anneal_steps=budget), name=ERE),
        replace(drop_in(framework, "off", algo, sampling="cer"), name=CER),
        replace(drop_in(framework, preset, algo, ratio_schedule="anneal", anneal_steps=budget), name=ANNEAL),
    ]
    return tuple(variants)


def _task(env_id: str, framework: str, algo: str, preset: str, budget: int, eval_freq: int, threshold: float,
          requires: str | None = None) -> StudyTask:
    return StudyTask(env_id, framework, algo, budget, eval_freq, threshold,
                     study_variants(framework, algo, preset, budget), requires)


def compiled_check(task: StudyTask) -> StudyTask:
    """``task`` with uniform sampling, eager and with ``training.compiled_updates``: the same math rounded
    otherwise, so P(compiled > eager) should not lie below 0.5."""
    uniform = replace(drop_in(task.framework, "off", task.algo), name=UNIFORM)
    compiled = replace(drop_in(task.framework, "off", task.algo, compiled_updates=True), name=COMPILED)
    return replace(task, variants=(uniform, compiled))


# Budgets: RL Zoo's for CartPole DQN (50k); Acrobot at half RL Zoo's 100k (its DQN reaches -100 well before;
# evaluated every 5k: ten 500-step episodes of an untrained policy cost more than the 5k steps of training);
# SAC at 30k, which the area score needs no threshold for; Tianshou's CartPole example at 40k.
TASKS = {
    "cartpole-dqn": _task("CartPole-v1", "sb3", "dqn", "classic_control", 50_000, 2_500, 475.0),
    "acrobot-dqn": _task("Acrobot-v1", "sb3", "dqn", "classic_control", 50_000, 5_000, -100.0),
    "cartpole-tianshou": _task("CartPole-v1", "tianshou", "dqn", "classic_control", 40_000, 2_000, 475.0),
    "pendulum-sac": _task("InvertedPendulum-v5", "sb3", "sac", "mujoco", 30_000, 1_500, 950.0, requires="mujoco"),
    "double-pendulum-sac": _task("InvertedDoublePendulum-v5", "sb3", "sac", "mujoco", 30_000, 1_500, 9_100.0,
                                 requires="mujoco"),
}
STUDY_TASKS = tuple(TASKS)
TASKS.update({f"{key}-compiled": compiled_check(TASKS[key]) for key in ("cartpole-dqn", "acrobot-dqn", "pendulum-sac")})
STUDIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "learning": (("the learning study: SB3 DQN on CartPole and Acrobot, SB3 SAC on InvertedPendulum and "
                  "InvertedDoublePendulum, Tianshou DQN on CartPole"), STUDY_TASKS),
    "compiled-check": (("the learning check of training.compiled_updates: SB3 DQN on CartPole and Acrobot, SB3 SAC on "
                        "InvertedPendulum, uniform sampling eager and compiled"),
                       ("cartpole-dqn-compiled", "acrobot-dqn-compiled", "pendulum-sac-compiled")),
    "learning-quick": (("the learning study's three cheapest tasks: SB3 DQN on CartPole and Acrobot, Tianshou DQN "
                        "on CartPole"), ("cartpole-dqn", "acrobot-dqn", "cartpole-tianshou")),
}


def get_study(name: str, only: Iterable[str] | None = None) -> tuple[StudyTask, ...]:
    """The tasks of study ``name`` (or only the task keys in ``only``)."""
    if name not in STUDIES:
        raise ConfigError(f"suite must be one of {sorted(STUDIES)} for a learning study, got suite={name!r}."
                          f"{did_you_mean(name, STUDIES)}")
    keys = STUDIES[name][1]
    if only is not None:
        only = list(only)
        for key in only:
            if key not in TASKS:
                raise ConfigError(f"tasks must name study tasks {sorted(TASKS)}, got {key!r}.{did_you_mean(key, TASKS)}")
        keys = tuple(k for k in keys if k in only) or tuple(only)
    return tuple(TASKS[k] for k in keys)


# ------------------------------------------------------------------ one run
def study_commands(meta: dict[str, Any]) -> list[str]:
    """The commands that produced a study's runs, in order (an older ``study.json`` holds one)."""
    if "commands" in meta:
        return list(meta["commands"])
    return [meta["command"]] if "command" in meta else []


def write_study_record(out: Path, name: str, records: list[dict[str, Any]], command: str) -> None:
    """``study.json``: what ``runs.jsonl`` holds (tasks, runs per variant) and every command that added to it.

    A study grown by several commands (more seeds, a subset of variants) lists them all, in order.
    """
    path = out / "study.json"
    earlier = study_commands(json.loads(path.read_text())) if path.exists() else []
    runs: dict[str, dict[str, int]] = {}
    for r in records:
        runs.setdefault(r["task"], {}).setdefault(r["variant"], 0)
        runs[r["task"]][r["variant"]] += 1
    path.write_text(json.dumps({
        "study": name, "tasks": list(runs), "runs": runs,
        "commands": [*[c for c in earlier if c != command], command],
        "updated": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))


def learning_run(task: StudyTask, variant: Variant, seed: int) -> dict[str, Any]:
    """Train ``variant`` on ``task`` for its whole budget with ``seed``; the run's JSON-ready record."""
    from rlaccel_plugins.bench.runner import run_one
    from rlaccel_plugins.bench.suites import Task

    record = run_one(Task(task.env_id, task.budget, task.eval_freq, (variant,), fixed_steps=True), variant, seed)
    return {**record, "task": task.key, "env_id": task.env_id, "budget": task.budget}


def _child(conn, target: Callable, task: StudyTask, variant: Variant, seed: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    try:
        conn.send(("ok", target(task, variant, seed)))
    except BaseException as exc:  # noqa: BLE001 - the parent records why, and goes on with the other runs
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


@dataclass(frozen=True)
class Job:
    task: StudyTask
    variant: Variant
    seed: int

    @property
    def key(self) -> tuple[str, str, int]:
        return self.task.key, self.variant.name, self.seed


def run_jobs(jobs: list[Job], workers: int, on_record: Callable[[dict[str, Any]], None],
             target: Callable = learning_run) -> None:
    """Run every job in a fresh process, ``workers`` at a time; ``on_record`` gets each run's record as it
    ends — ``status: "ok"`` with the run's data, or ``status: "failed"`` with why (an exception, or the
    process dying: only that run is lost)."""
    context = process_context()
    pending, running = list(jobs), {}  # type: ignore[var-annotated]
    while pending or running:
        while pending and len(running) < workers:
            job = pending.pop(0)
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=with_environment, daemon=True,
                                      args=(dict(os.environ), _child, send, target, job.task, job.variant, job.seed))
            process.start()
            send.close()
            running[receive] = (job, process, time.perf_counter())
        ready = wait([*running, *(p.sentinel for _, p, _ in running.values())])
        for receive in [r for r, (_, p, _) in running.items() if r in ready or p.sentinel in ready]:
            job, process, started = running[receive]
            try:
                status, payload = receive.recv() if receive.poll() else ("failed", None)
            except (EOFError, OSError):
                status, payload = "failed", None
            process.join()
            del running[receive]
            receive.close()
            if status == "ok":
                record = {**(payload or {}), "status": "ok"}
            else:
                record = {"task": job.task.key, "variant": job.variant.name, "seed": job.seed, "status": "failed",
                          "error": payload or f"the worker process died (exit code {process.exitcode})"}
            record["worker_seconds"] = time.perf_counter() - started
            on_record(record)


# ------------------------------------------------------------------ the record file
def read_runs(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``runs.jsonl`` (a torn last line, from a kill mid-write, is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class RunLog:
    """Appends one JSON line per run, flushed and fsynced before the next run is counted done."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(record, default=str) + "\n")
            out.flush()
            os.fsync(out.fileno())


def plan(tasks: tuple[StudyTask, ...], seeds: int, first_seed: int = 0,
         done: Iterable[tuple[str, str, int]] = ()) -> list[Job]:
    """Every (task, variant, seed) not in ``done``, seed-major (all variants of seed 0 first), so an
    interrupted study has whole seeds to compare."""
    done = set(done)
    return [Job(task, variant, seed) for seed in range(first_seed, first_seed + seeds) for task in tasks
            for variant in task.variants if (task.key, variant.name, seed) not in done]


def run_study(name: str, seeds: int = 10, workers: int | None = None, out: str | Path = "study-results",
              resume: bool = False, first_seed: int = 0, only: Iterable[str] | None = None,
              variants: Iterable[str] | None = None, steps: int | None = None,
              target: Callable = learning_run) -> list[dict[str, Any]]:
    """`rlaccel bench --suite learning[-quick]`: run the study's missing runs (the report is
    :func:`rlaccel_plugins.bench.study_report.write_report`'s).

    Returns every ok record of ``out/runs.jsonl`` (those of earlier sessions included).
    """
    from rlaccel_plugins.errors import invalid
    from rlaccel_plugins.hardware import cpu_count

    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise invalid("seeds", "be a positive integer", seeds)
    workers = cpu_count() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise invalid("workers", "be a positive integer", workers)
    tasks = get_study(name, only)
    for task in tasks:
        if task.missing():
            print(f"skipping {task.key}: {task.missing()}", flush=True)
    tasks = tuple(t for t in tasks if not t.missing())
    if steps is not None:  # another budget (a smoke run, the demo): at least four evaluations
        tasks = tuple(replace(t, budget=steps, eval_freq=max(1, min(t.eval_freq, steps // 4))) for t in tasks)
    if variants is not None:
        variants = wanted = list(variants)
        known = list(dict.fromkeys(v.name for t in tasks for v in t.variants))
        for v in wanted:
            if v not in known:
                raise ConfigError(f"variants must name variants of the study's tasks {known}, got {v!r}."
                                  f"{did_you_mean(v, known)}")
        tasks = tuple(replace(t, variants=tuple(v for v in t.variants if v.name in wanted)) for t in tasks)
    out = Path(out)
    runs_path = out / RUNS_FILE
    if runs_path.exists() and not resume:
        raise ConfigError(f"out must not hold an earlier study unless --resume is given, got out={str(out)!r} with "
                          f"{len(read_runs(runs_path))} runs in {RUNS_FILE}. Pass --resume to go on with it, or "
                          "another --out.")
    done = [(r["task"], r["variant"], r["seed"]) for r in read_runs(runs_path) if r.get("status") == "ok"]
    jobs = plan(tasks, seeds, first_seed, done)
    log = RunLog(runs_path)
    print(f"{name}: {len(jobs)} runs to do ({len(done)} already in {runs_path}), {workers} workers", flush=True)
    count = {"n": 0}

    def record(result: dict[str, Any]) -> None:
        log.append(result)
        count["n"] += 1
        if result["status"] == "ok":
            curve = result.get("curve") or [{}]
            shown = f"final eval {curve[-1].get('mean_reward', float('nan')):.1f}"
        else:
            shown = f"FAILED: {result['error']}"
        print(f"[{count['n']}/{len(jobs)}] {result['task']} | {result['variant']} | seed {result['seed']}: "
              f"{shown} ({result['worker_seconds']:.0f} s)", flush=True)

    run_jobs(jobs, workers, record, target)
    records = [r for r in read_runs(runs_path) if r.get("status") == "ok"]
    command = (f"rlaccel bench --suite {name} --seeds {seeds} --workers {workers} --out {out}"
               + (f" --first-seed {first_seed}" if first_seed else "")
               + (f" --tasks {','.join(only)}" if only is not None else "")
               + "".join(f" --variant {shlex.quote(v)}" for v in variants or ())
               + (f" --steps {steps}" if steps else "") + (" --resume" if resume else ""))
    write_study_record(out, name, records, command)
    return records
