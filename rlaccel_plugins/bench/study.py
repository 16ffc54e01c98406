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

from rlaccel_plugins.bench.processes import process_context, run_with_provenance, with_environment
from rlaccel_plugins.bench.suites import Variant, drop_in
from rlaccel_plugins.errors import ConfigError, did_you_mean

RUNS_FILE = "runs.jsonl"


@dataclass(frozen=True)
class StudyTask:
    """One task of a study: an algorithm on an env, a fixed budget, the variants compared on it.

    ``threshold`` is the normalised score's 1 (the random policy's return is its 0), and what
    env steps to threshold count to. ``hyperparams`` change the framework's recipe for every variant; ``sweep``:
    the task is a sweep's point (its recipe changed to vary one setting), left out of the family decisions;
    ``label`` names the task in every table.
    """

    env_id: str
    framework: str
    algo: str
    budget: int
    eval_freq: int
    threshold: float
    variants: tuple[Variant, ...]
    requires: str | None = None
    label: str | None = None
    hyperparams: tuple[tuple[str, Any], ...] = ()
    sweep: bool = False

    @property
    def key(self) -> str:
        return self.label or f"{self.framework} {self.algo.upper()} {self.env_id}"

    def missing(self) -> str | None:
        """Why this task cannot run here, or None."""
        import importlib.util

        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"{self.env_id} needs the {self.requires!r} module"
        return None


# What the variants are called in every study table and plot. Each drop-in variant names its sampling
# explicitly, so a label means what it sampled whatever the defaults become; every run also records the
# sampling its buffer resolved (``replay_sampling``), and the report refuses a variant whose runs differ.
STOCK, UNIFORM, TIERS, ARTICLE = "stock", "drop-in, uniform (off)", "drop-in, tiers (preset)", "drop-in, article tiers"
ERE, CER, ANNEAL = "drop-in + ERE", "drop-in + CER", "drop-in, tiers annealed"
COMPILED = "drop-in, uniform + compiled updates"  # training.compiled_updates: the learning check of a re-rounding
# image observations: the article's other technique, sparse/dense updates (the head alone trains on 99 steps of 100)
SPARSE_DENSE = "drop-in, uniform + sparse/dense (head)"
BASELINES = {STOCK: STOCK, UNIFORM: UNIFORM}  # what the other variants are compared against
# Until 2026-12-06 the no-argument default sampled the article's tiers scaled to the buffer for every
# algorithm, and the study called that variant "drop-in, no argument": its runs are the article-tiers runs.
LEGACY_NAMES = {"drop-in, no argument": ARTICLE}


def study_variants(framework: str, algo: str, preset: str, budget: int,
                   candidates: bool = True) -> tuple[Variant, ...]:
    """Stock; the drop-in sampling uniformly, by the article's tiers scaled to the buffer (what the
    no-argument default samples where the evidence keeps it) and, with ``candidates``, by the task
    family's ``preset`` tiers and the other candidate schemes."""
    variants = [
        Variant(STOCK, framework, algo=algo, stock=True, role="yardstick"),
        replace(drop_in(framework, "off", algo), name=UNIFORM),
        replace(drop_in(framework, "default", algo, sampling="tiers"), name=ARTICLE),
    ]
    if candidates:
        variants[2:2] = [replace(drop_in(framework, preset, algo, sampling="tiers"), name=TIERS)]
        variants += [
            replace(drop_in(framework, "off", algo, sampling="ere", anneal_steps=budget), name=ERE),
            replace(drop_in(framework, "off", algo, sampling="cer"), name=CER),
            replace(drop_in(framework, preset, algo, ratio_schedule="anneal", anneal_steps=budget), name=ANNEAL),
        ]
    return tuple(variants)


def pixel_variants(framework: str, algo: str) -> tuple[Variant, ...]:
    """Stock; the drop-in sampling uniformly, by the article's tiers, and uniformly with sparse/dense updates of the
    head. The ``atari`` preset needs no variant of its own: it trains every update full (before the pixel study,
    its last three layers: this whole network on MinAtar) and samples as the evidence decides (``auto``), so it
    trains what the tiers or the uniform variant trains."""
    return (*study_variants(framework, algo, "atari", 0, candidates=False),
            replace(drop_in(framework, "off", algo, sparse_update_interval=100, dense_layers=[-1]), name=SPARSE_DENSE))


def _task(env_id: str, framework: str, algo: str, preset: str, budget: int, eval_freq: int,
          requires: str | None = None, candidates: bool = True, threshold: float | None = None,
          variants: tuple[Variant, ...] | None = None) -> StudyTask:
    """A study task; its threshold is the task registry's (:mod:`rlaccel_plugins.tasks`) unless given (a task
    with no solved return, whose scores still need a scale)."""
    from rlaccel_plugins.tasks import task_info

    threshold = threshold if threshold is not None else task_info(env_id).threshold
    if threshold is None:  # the study's scores are normalised by it
        raise ValueError(f"the study needs a threshold for {env_id}: add it to rlaccel_plugins.tasks.THRESHOLDS")
    return StudyTask(env_id, framework, algo, budget, eval_freq, threshold,
                     variants or study_variants(framework, algo, preset, budget, candidates), requires)


def compiled_check(task: StudyTask) -> StudyTask:
    """``task`` with uniform sampling, eager and with ``training.compiled_updates``: the same math rounded
    otherwise, so P(compiled > eager) should not lie below 0.5."""
    uniform = replace(drop_in(task.framework, "off", task.algo, compiled_updates=False), name=UNIFORM)
    compiled = replace(drop_in(task.framework, "off", task.algo, compiled_updates=True), name=COMPILED)
    return replace(task, variants=(uniform, compiled))


def volume_base() -> dict[str, int]:
    """The replay-volume sweep's base, the study's own CartPole DQN task at RL Zoo's settings: ``gradient_steps``
    of ``batch_size`` per ``train_freq`` env steps (the SB3 adapter's recipe, ``AdapterSpec.recipes``)."""
    from rlaccel_plugins.plugins import get_plugin_manager

    zoo = get_plugin_manager().adapters.get("sb3").load("recipes")("dqn", "CartPole-v1")
    return {key: zoo[key] for key in ("gradient_steps", "batch_size", "train_freq")}


def replay_volume(task: StudyTask, gradient_steps: int) -> StudyTask:
    """``task`` (an SB3 task updating in rounds) at ``gradient_steps`` per round, uniform against the article's
    tiers: one point of the replay-volume sweep (samples per env step = gradient_steps x batch / train_freq)."""
    variants = tuple(v for v in task.variants if v.name in (UNIFORM, ARTICLE))
    return replace(task, variants=variants, label=f"{task.key}, gradient_steps={gradient_steps}",
                   hyperparams=(("gradient_steps", gradient_steps),), sweep=True)


# Budgets: RL Zoo's for CartPole DQN and QR-DQN (50k) and Pendulum SAC and TD3 (20k); Acrobot at half RL Zoo's
# 100k (its DQN reaches -100 well before; evaluated every 5k: ten 500-step episodes of an untrained policy cost
# more than the 5k steps of training); the MuJoCo SAC tasks at 30k, which the area score needs no threshold for;
# Tianshou's CartPole example at 40k.
TASKS = {
    "cartpole-dqn": _task("CartPole-v1", "sb3", "dqn", "classic_control", 50_000, 2_500),
    "acrobot-dqn": _task("Acrobot-v1", "sb3", "dqn", "classic_control", 50_000, 5_000),
    "cartpole-tianshou": _task("CartPole-v1", "tianshou", "dqn", "classic_control", 40_000, 2_000),
    "cartpole-qrdqn": _task("CartPole-v1", "sb3", "qrdqn", "classic_control", 50_000, 2_500, candidates=False),
    "pendulum-v1-sac": _task("Pendulum-v1", "sb3", "sac", "mujoco", 20_000, 1_000, candidates=False),
    "pendulum-v1-td3": _task("Pendulum-v1", "sb3", "td3", "mujoco", 20_000, 1_000, candidates=False),
    "pendulum-sac": _task("InvertedPendulum-v5", "sb3", "sac", "mujoco", 30_000, 1_500, requires="mujoco",
                          candidates=False),
    "double-pendulum-sac": _task("InvertedDoublePendulum-v5", "sb3", "sac", "mujoco", 30_000, 1_500,
                                 requires="mujoco", candidates=False),
}
# the demo's: stock against the drop-in as a user gets it with no argument (the sampling the default resolves
# for the task's family, recorded per run)
NO_ARGUMENT = "drop-in, no argument"
TASKS["cartpole-dqn-demo"] = replace(TASKS["cartpole-dqn"], variants=(
    TASKS["cartpole-dqn"].variants[0], replace(drop_in("sb3", "default"), name=NO_ARGUMENT)))
STUDY_TASKS = ("cartpole-dqn", "acrobot-dqn", "cartpole-tianshou")
FAMILY_TASKS = ("pendulum-v1-sac", "pendulum-v1-td3", "cartpole-qrdqn", "pendulum-sac", "double-pendulum-sac")
VOLUME_STEPS = (16, 64, 256)
COMPILED_CHECKS = ("cartpole-dqn", "acrobot-dqn", "pendulum-v1-sac", "pendulum-sac", "cartpole-qrdqn", "pendulum-v1-td3")
TASKS.update({f"{key}-compiled": compiled_check(TASKS[key]) for key in COMPILED_CHECKS})
# PPO at RL Zoo's CartPole budget: only its compiled check (its update samples no replay)
TASKS["cartpole-ppo-compiled"] = compiled_check(_task("CartPole-v1", "sb3", "ppo", "classic_control", 100_000, 5_000,
                                                      candidates=False))
TASKS.update({f"cartpole-dqn-gs{g}": replay_volume(TASKS["cartpole-dqn"], g) for g in VOLUME_STEPS})
# Images: SB3 DQN on two MinAtar games (the `minatar` extra) at the MinAtar paper's recipe, its exploration (1 -> 0.1
# over the paper's first 100k of 5M frames) compressed to the first tenth of the budget. The budget is the pilot's
# (docs/notes/pixels.md): a run costs about 5.4 ms per env step on one core, so 4 variants x 2 games x 10 seeds of
# 75k steps take about 4.6 h on 2 cores. MinAtar has no solved return: the thresholds are a scale (about what the
# pilot's stock runs reached at 75k steps); P(X > Y) does not depend on them.
MINATAR_BUDGET, MINATAR_EVAL = 75_000, 7_500
MINATAR_THRESHOLDS = {"Breakout": 5.0, "SpaceInvaders": 15.0}


def _minatar_task(game: str) -> StudyTask:
    task = _task(f"MinAtar/{game}-v1", "sb3", "dqn", "atari", MINATAR_BUDGET, MINATAR_EVAL, requires="minatar",
                 threshold=MINATAR_THRESHOLDS[game], variants=pixel_variants("sb3", "dqn"))
    return replace(task, hyperparams=(("exploration_fraction", 0.1),))


PIXEL_TASKS = tuple(f"minatar-{game.lower()}-dqn" for game in MINATAR_THRESHOLDS)
TASKS.update({key: _minatar_task(game) for key, game in zip(PIXEL_TASKS, MINATAR_THRESHOLDS)})
STUDIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "learning": (("the learning study: SB3 DQN on CartPole and Acrobot, Tianshou DQN on CartPole (every candidate "
                  "scheme), then SB3 QR-DQN on CartPole, SAC and TD3 on Pendulum, SAC on InvertedPendulum and "
                  "InvertedDoublePendulum (stock, uniform, the article's tiers)"), STUDY_TASKS + FAMILY_TASKS),
    "families": (("every algorithm family the no-argument default could touch beyond DQN: SB3 QR-DQN on CartPole, "
                  "SAC and TD3 on Pendulum, SAC on InvertedPendulum and InvertedDoublePendulum"), FAMILY_TASKS),
    "replay-volume": (("SB3 DQN on CartPole at 16, 64 and 256 gradient steps per round of 256 env steps (the study's "
                       "task has 128): uniform against the article's tiers"),
                      tuple(f"cartpole-dqn-gs{g}" for g in VOLUME_STEPS)),
    "compiled-check": (("the learning check of training.compiled_updates: SB3 DQN on CartPole and Acrobot, SAC on "
                        "Pendulum and InvertedPendulum, QR-DQN on CartPole, TD3 on Pendulum, PPO on CartPole; uniform "
                        "sampling, eager and compiled"),
                       (*(f"{key}-compiled" for key in COMPILED_CHECKS), "cartpole-ppo-compiled")),
    "learning-quick": (("the learning study's three cheapest tasks: SB3 DQN on CartPole and Acrobot, Tianshou DQN "
                        "on CartPole"), STUDY_TASKS),
    "pixels": (("images: SB3 DQN on MinAtar Breakout and Space Invaders at the MinAtar paper's recipe (stock; the "
                "drop-in sampling uniformly, by the article's tiers, uniformly with sparse/dense updates of the "
                "head)"), PIXEL_TASKS),
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
    """``study.json``: what ``runs.jsonl`` holds (tasks, runs per variant), every command that added to it and
    the commits its runs were made at.

    A study grown by several commands (more seeds, a subset of variants) lists them all, in order; runs made
    before runs recorded their provenance (commit, versions, machine) are counted.
    """
    path = out / "study.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    earlier = study_commands(meta)
    suites = list(dict.fromkeys([*meta.get("suites", [meta["study"]] if "study" in meta else []), name]))
    runs: dict[str, dict[str, int]] = {}
    for r in records:
        runs.setdefault(r["task"], {}).setdefault(r["variant"], 0)
        runs[r["task"]][r["variant"]] += 1
    commits = sorted({r["provenance"]["commit"] for r in records if r.get("provenance", {}).get("commit")})
    unrecorded = sum("provenance" not in r for r in records)
    renamed = {r["recorded_as"]: r["variant"] for r in records if "recorded_as" in r}
    path.write_text(json.dumps({
        "study": suites[0], "suites": suites, "tasks": list(runs), "runs": runs,
        "commands": [*[c for c in earlier if c != command], command],
        "commits": commits,  # each run's own, with its package versions and machine, is in its record
        **({"runs_without_provenance": unrecorded} if unrecorded else {}),
        # older commands name variants by their names then: each is today's (LEGACY_NAMES)
        **({"variants_renamed": renamed} if renamed else {}),
        "updated": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))


def learning_run(task: StudyTask, variant: Variant, seed: int) -> dict[str, Any]:
    """Train ``variant`` on ``task`` for its whole budget with ``seed``; the run's JSON-ready record."""
    from rlaccel_plugins.bench.runner import run_one
    from rlaccel_plugins.bench.suites import Task

    if task.hyperparams:
        variant = replace(variant, hyperparams={**dict(task.hyperparams), **variant.hyperparams})
    record = run_one(Task(task.env_id, task.budget, task.eval_freq, (variant,), fixed_steps=True), variant, seed)
    config = {"framework": variant.framework, "algo": variant.algo, "stock": variant.stock, "preset": variant.preset,
              "overrides": variant.overrides, "hyperparams": variant.hyperparams}
    return {**record, "task": task.key, "env_id": task.env_id, "budget": task.budget, "config": config}


def _child(conn, target: Callable, task: StudyTask, variant: Variant, seed: int) -> None:
    try:
        conn.send(run_with_provenance(target, task, variant, seed))
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


def finished(job: Job, status: str, payload: Any, seconds: float) -> dict[str, Any]:
    """A job's record: ``status: "ok"`` with the run's data, or ``status: "failed"`` with why."""
    if status == "ok":
        record = {**(payload or {}), "status": "ok"}
    else:
        record = {"task": job.task.key, "variant": job.variant.name, "seed": job.seed, "status": "failed",
                  "error": payload}
    record["worker_seconds"] = seconds
    return record


def run_jobs(jobs: list[Job], workers: int, on_record: Callable[[dict[str, Any]], None],
             target: Callable = learning_run, may_start: Callable[[], bool] = lambda: True) -> None:
    """Run every job in a fresh process, ``workers`` at a time; ``on_record`` gets each run's record as it
    ends (:func:`finished`: an exception, or the process dying, fails only that run). Once ``may_start()``
    says no, no more jobs start; the running ones end and are recorded."""
    context = process_context()
    pending, running = list(jobs), {}  # type: ignore[var-annotated]
    while running or (pending and may_start()):
        while pending and len(running) < workers and may_start():
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
            on_record(finished(job, status, payload or (None if status == "ok" else
                                                        f"the worker process died (exit code {process.exitcode})"),
                               time.perf_counter() - started))


# ------------------------------------------------------------------ the record file
def read_runs(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``runs.jsonl`` (a torn last line, from a kill mid-write, is skipped); a run from before
    runs recorded their sampling carries its variant's name of today (:data:`LEGACY_NAMES`)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "replay_sampling" not in record and record.get("variant") in LEGACY_NAMES:
            record = {**record, "variant": LEGACY_NAMES[record["variant"]], "recorded_as": record["variant"]}
        records.append(record)
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


ATTEMPTS = 2  # a failed run is retried once, then counted as failed (and never re-run by --resume)


def plan(tasks: tuple[StudyTask, ...], seeds: int, first_seed: int = 0,
         records: Iterable[dict[str, Any]] = ()) -> list[Job]:
    """Every (task, variant, seed) still to run given the ``records`` already written, seed-major (all variants
    of seed 0 first, so an interrupted study has whole seeds to compare): a finished run is never re-run, a
    failed one only while it has failed fewer than :data:`ATTEMPTS` times."""
    done, failures = set(), {}  # type: ignore[var-annotated]
    for r in records:
        key = (r["task"], r["variant"], r["seed"])
        if r.get("status") == "ok":
            done.add(key)
        else:
            failures[key] = failures.get(key, 0) + 1
    return [Job(task, variant, seed) for seed in range(first_seed, first_seed + seeds) for task in tasks
            for variant in task.variants
            if (task.key, variant.name, seed) not in done and failures.get((task.key, variant.name, seed), 0) < ATTEMPTS]


def run_study(name: str, seeds: int = 10, workers: int | None = None, out: str | Path = "study-results",
              resume: bool = False, first_seed: int = 0, only: Iterable[str] | None = None,
              variants: Iterable[str] | None = None, steps: int | None = None,
              target: Callable = learning_run, ray: str | None = None) -> list[dict[str, Any]]:
    """`rlaccel bench --suite learning[-quick]`: run the study's missing runs (the report is
    :func:`rlaccel_plugins.bench.study_report.write_report`'s).

    ``ray``: run each run as a Ray task on the cluster at this address (``auto``: the one ``ray start`` runs
    here; ``HOST:PORT``; ``local``: a Ray started for this study) instead of ``workers`` local processes; the
    records and the resume semantics are the same. A failed run is retried once, then counted as failed.
    Returns every ok record of ``out/runs.jsonl`` (those of earlier sessions included).
    """
    from rlaccel_plugins.bench.report import code_state, provenance
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
    earlier = read_runs(runs_path)
    jobs = plan(tasks, seeds, first_seed, earlier)
    log = RunLog(runs_path)
    done = sum(r.get("status") == "ok" for r in earlier)
    where = f"Ray tasks on {ray}" if ray else f"{workers} workers"
    print(f"{name}: {len(jobs)} runs to do ({done} already in {runs_path}), {where}", flush=True)
    count = {"n": 0, "of": len(jobs)}
    origin = provenance()
    started_with = code_state()

    def code_unchanged() -> bool:  # a run started after an edit would record code it did not run
        return code_state() == started_with

    def record(result: dict[str, Any]) -> None:  # a failed run, whose process may be gone, gets the study's provenance
        result = {**result, "provenance": result.get("provenance") or origin}
        log.append(result)
        count["n"] += 1
        if result["status"] == "ok":
            curve = result.get("curve") or [{}]
            shown = f"final eval {curve[-1].get('mean_reward', float('nan')):.1f}"
        else:
            shown = f"FAILED: {result['error']}"
        print(f"[{count['n']}/{count['of']}] {result['task']} | {result['variant']} | seed {result['seed']}: "
              f"{shown} ({result['worker_seconds']:.0f} s)", flush=True)

    def run(batch: list[Job]) -> None:
        if ray:
            from rlaccel_plugins.bench.ray_jobs import run_jobs_on_ray

            run_jobs_on_ray(batch, ray, lambda *ended: record(finished(*ended)), target, code_unchanged)
        else:
            run_jobs(batch, workers, record, target, code_unchanged)

    while jobs and code_unchanged():  # every planned run once, then the failed ones, until done or out of attempts
        run(jobs)
        jobs = plan(tasks, seeds, first_seed, read_runs(runs_path))
        count["of"] += len(jobs)
    records = [r for r in read_runs(runs_path) if r.get("status") == "ok"]
    command = (f"rlaccel bench --suite {name} --seeds {seeds} --workers {workers} --out {out}"
               + (f" --first-seed {first_seed}" if first_seed else "")
               + (f" --tasks {','.join(only)}" if only is not None else "")
               + "".join(f" --variant {shlex.quote(v)}" for v in variants or ())
               + (f" --steps {steps}" if steps else "") + (f" --ray {ray}" if ray else "")
               + (" --resume" if resume else ""))
    write_study_record(out, name, records, command)
    if jobs:
        raise ConfigError(
            f"the code must not change while a study runs, got {code_state()} where the study started with "
            f"{started_with}: the runs still to do would record code they did not run, so none of them started "
            f"({len(jobs)} left; the {count['n']} that ended are in {runs_path}). Commit or undo the edit and go "
            "on with --resume; to edit code while a study runs, run it from a checkout of its own "
            "(git worktree add ../study-checkout).")
    return records
