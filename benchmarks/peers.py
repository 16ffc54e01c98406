"""The same training work through stock SB3, its best thread count, ``torch.compile``, the drop-in and
SBX (SB3 rewritten in JAX): which is the fastest way to train an SB3 agent on this machine.

Tasks at RL Zoo's settings (``rlaccel_sb3.train.ZOO``): ``dqn-cartpole`` (DQN CartPole-v1),
``sac-pendulum`` and ``td3-pendulum`` (Pendulum-v1), ``sac-halfcheetah`` (SAC HalfCheetah-v5, MuJoCo),
``ppo-cartpole`` (PPO CartPole-v1, 8 envs), ``dqn-minatar-breakout`` (DQN MinAtar/Breakout-v1 at the MinAtar
paper's recipe and network; the ``minatar`` extra), ``dqn-pong`` (DQN ``CnnPolicy`` on Pong at RL Zoo's Atari
settings, SB3's ``AtariWrapper`` and a 4-frame stack as RL Zoo builds it, learning from 2,000 env steps instead of
RL Zoo's 100,000 so that the warm-up reaches the updates: the same updates, sooner). Variants:

- ``stock``: SB3 as installed, torch's default thread count (the cores);
- ``stock 1-thread``: the same with ``torch.set_num_threads(1)`` (the report names the better of the two);
- ``stock + torch.compile``: every network of the policy compiled in place (``Module.compile()``);
- ``stock + optimize_memory_usage``: SB3's buffer storing each observation once (image tasks);
- ``drop-in``: the README's two lines (``TieredReplayBuffer``, ``AccelerateCallback()``; PPO: the callback),
  as a user gets them: ``compiled_updates: auto`` compiles a ``learn()`` call's gradient steps where it plans
  enough of them (DQN, SAC), so the short warm-up call runs eagerly and the work loads (or compiles) the
  step: in the first round its steady time includes that, in later rounds the step is in memory;
- ``drop-in eager``: the drop-in with ``compiled_updates=False`` (where the algorithm has a compiled step);
- ``drop-in + compiled``: the drop-in with ``compiled_updates=True`` (compiled from the warm-up on);
- ``drop-in + channels_last``: the drop-in with ``channels_last=True`` (convolutional policies);
- ``drop-in + head-only dense``: the drop-in with the sparse/dense schedule training only the output layer on
  99 of every 100 gradient steps (``sparse_update_interval=100, dense_layers=[-1]``; convolutional policies);
- ``drop-in + article schedule``: the drop-in with the article's sparse/dense schedule, the last three layers on
  99 of every 100 gradient steps (``presets.ARTICLE_SCHEDULE``: the default until the pixel study; convolutional
  policies);
- ``SBX``: ``sbx.<ALGO>`` with the same settings (``pip install -e ".[peers]"``; left out when not installed,
  and on tasks whose recipe names a network of its own, which SBX's policies cannot take: MinAtar's; on Atari
  its own ``CnnPolicy``, NatureCNN in JAX).

Every run builds a fresh model, learns a warm-up stretch (past ``learning_starts`` and the first updates,
so JIT and compilation happen there), then the fixed work, ``--steps`` env steps: the **steady** time is
the work's, **end to end** is warm-up + work (what a user pays). The variants take turns within a round,
the order reversed every other round; ratios are taken within a round and reported as the median over
rounds with a 95% bootstrap CI of it (with 3 rounds the CI is the rounds' range). ``--busy 0,1,2`` measures
every variant again beside that many busy processes (a section each); ``--new-processes`` runs each run in a
new process (a later run on the machine: compiled steps on disk, nothing in memory; JAX's JIT anew).
Results: ``peers.json`` in ``--out`` (read by ``python -m benchmarks.results_index``) and a table on stdout.

Usage:
    python -m benchmarks.peers [--tasks dqn-cartpole,sac-pendulum] [--rounds 3] [--out benchmarks/results/peers]
    python -m benchmarks.peers --tasks dqn-cartpole --steps 2000 --warmup 1500 --rounds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
from rlaccel_sb3.fused.registry import COMPILED
from rlaccel_sb3.train import zoo_settings

from benchmarks import _results
from rlaccel_plugins.bench.report import machine
from rlaccel_plugins.bench.speed import ratio_ci
from rlaccel_plugins.bench.timing import interleaved
from rlaccel_plugins.presets import ARTICLE_SCHEDULE
from rlaccel_plugins.tasks import ensure_registered, task_info


@dataclass(frozen=True)
class Task:
    algo: str
    env_id: str
    steps: int  # the fixed work (env steps) after the warm-up
    warmup: int  # env steps before it: past learning_starts and a few updates
    learning_starts: int | None = None  # in place of RL Zoo's (None: RL Zoo's)


# the drop-in variants' AccelerateCallback arguments: the default (compiled_updates auto), never or always
# compiled, channels-last convolutions, the sparse/dense schedule on the output layer
DROP_IN = {"drop-in": {}, "drop-in eager": dict(compiled_updates=False), "drop-in + compiled": dict(compiled_updates=True),
           "drop-in + channels_last": dict(channels_last=True),
           "drop-in + head-only dense": dict(sparse_update_interval=100, dense_layers=[-1]),
           "drop-in + article schedule": dict(ARTICLE_SCHEDULE)}
TASKS = {"dqn-cartpole": Task("dqn", "CartPole-v1", 20_000, 2_000),
         "sac-pendulum": Task("sac", "Pendulum-v1", 3_000, 500),
         "td3-pendulum": Task("td3", "Pendulum-v1", 3_000, 10_500),
         "sac-halfcheetah": Task("sac", "HalfCheetah-v5", 2_000, 10_500),
         "ppo-cartpole": Task("ppo", "CartPole-v1", 16_384, 2_048),
         "dqn-minatar-breakout": Task("dqn", "MinAtar/Breakout-v1", 5_000, 6_000),
         "dqn-pong": Task("dqn", "Pong-v5", 4_000, 2_500, learning_starts=2_000)}
VARIANTS = ("stock", "stock 1-thread", "stock + torch.compile", "stock + optimize_memory_usage", *DROP_IN, "SBX")
# for convolutional policies only
IMAGE_VARIANTS = ("stock + optimize_memory_usage", "drop-in + channels_last", "drop-in + head-only dense",
                  "drop-in + article schedule")
COMPILED_ALGOS = tuple(name.lower() for name in COMPILED)  # algorithms with a compiled step (the registry's)


def sbx_available() -> bool:
    try:
        import sbx  # noqa: F401
    except ImportError:
        return False
    return True


def build_model(task: Task, variant: str):
    """The variant's fresh model and its ``learn()`` callback."""
    ensure_registered(task.env_id)
    settings = zoo_settings(task.algo, task.env_id)
    settings.pop("n_timesteps", None)
    n_envs = settings.pop("n_envs", 1)
    if task.learning_starts is not None:
        settings["learning_starts"] = task.learning_starts
    policy = "CnnPolicy" if task_info(task.env_id).atari else "MlpPolicy"
    if variant == "SBX":
        import sbx

        cls = getattr(sbx, task.algo.upper())
        settings.pop("optimize_memory_usage", None)
        return cls(policy, _env(task, n_envs), seed=0, **settings), None
    import stable_baselines3

    cls = getattr(stable_baselines3, task.algo.upper())
    callback = None
    if variant.startswith("drop-in"):
        if task.algo != "ppo":
            settings.update(replay_buffer_class=TieredReplayBuffer)
        callback = AccelerateCallback(**DROP_IN[variant])
    if variant == "stock + optimize_memory_usage":  # SB3 needs timeouts unhandled for it
        settings.update(optimize_memory_usage=True, replay_buffer_kwargs=dict(handle_timeout_termination=False))
    model = cls(policy, _env(task, n_envs), seed=0, device="cpu", **settings)
    if variant == "stock + torch.compile":
        for network in model.policy.children():  # in place: the parameters and state_dict keys stay
            network.compile()
    return model, callback


def _env(task: Task, n_envs: int):
    if task_info(task.env_id).atari:  # as RL Zoo builds it: AtariWrapper on <Game>NoFrameskip-v4, 4 frames
        from rlaccel_sb3.envs import make_env

        return make_env(task.env_id, n_envs, seed=0, accelerated=False)
    if n_envs == 1:
        return task.env_id
    from stable_baselines3.common.env_util import make_vec_env

    return make_vec_env(task.env_id, n_envs=n_envs, seed=0)


def run_once(task: Task, variant: str, steps: int, warmup: int) -> dict[str, Any]:
    """One fresh run: seconds of the warm-up, of the fixed work, and of both; for the drop-in, what its
    compiled step cost (``compiled``: ``[["compiled" | "loaded", seconds], ...]``, empty where it was in memory
    or not used) and which update the work ran (``update``)."""
    from rlaccel_plugins.fused import compiled_step

    events_before = _compiled_events(compiled_step)
    threads = torch.get_num_threads()
    if variant == "stock 1-thread":
        torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        model, callback = build_model(task, variant)
        model.learn(warmup, callback=callback)
        warm = time.perf_counter()
        model.learn(steps, callback=callback, reset_num_timesteps=False)
        end = time.perf_counter()
    finally:
        torch.set_num_threads(threads)
    result: dict[str, Any] = {"warmup": warm - start, "steady": end - warm, "end_to_end": end - start}
    if callback is not None:
        result.update(update=callback.update_path, compiled=_compiled_events(compiled_step)[len(events_before):])
    return result


def _compiled_events(compiled_step) -> list:
    return [list(event) for call in compiled_step._COMPILED.values() for event in getattr(call, "events", [])]


def run_in_new_process(task: Task, variant: str, steps: int, warmup: int) -> dict[str, Any]:
    """:func:`run_once` in a new Python process (imports not timed): what a second run on the machine pays,
    with nothing compiled in memory — inductor's and rlaccel's on-disk caches as earlier runs left them,
    JAX's in-memory JIT cache empty."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(run_once, (task, variant, steps, warmup))


def variants_for(task: Task, wanted: list[str]) -> list[str]:
    pixels = task_info(task.env_id).pixels  # a convolutional policy
    own_network = task_info(task.env_id).minatar  # a recipe whose network SBX's policies cannot take
    out = [v for v in wanted if v != "SBX" or (sbx_available() and not own_network)]
    if not pixels:
        out = [v for v in out if v not in IMAGE_VARIANTS]
    if task.algo not in COMPILED_ALGOS:
        out = [v for v in out if v not in ("drop-in eager", "drop-in + compiled")]
    if torch.get_num_threads() == 1:
        out = [v for v in out if v != "stock 1-thread"]
    return out


def measure(name: str, task: Task, variants: list[str], rounds: int, steps: int, warmup: int,
            new_processes: bool = False) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    run = run_in_new_process if new_processes else run_once

    def one(variant: str) -> Callable[[], float]:
        def go() -> float:
            result = run(task, variant, steps, warmup)
            runs[variant].append(result)
            print(f"  {name} {variant:<28} steady {result['steady']:7.2f} s  end to end {result['end_to_end']:7.2f} s",
                  flush=True)
            return result["steady"]
        return go

    interleaved({v: one(v) for v in variants}, rounds, alternate=True)
    return {"algo": task.algo, "env_id": task.env_id, "steps": steps, "warmup": warmup, "runs": runs,
            "new_processes": new_processes,
            "ratios": {kind: ratios(runs, kind) for kind in ("steady", "end_to_end")}}


def ratios(runs: dict[str, list[dict[str, float]]], kind: str) -> dict[str, dict[str, list[float]]]:
    """Per variant, ``[median, low, high]`` of its time over stock's and over SBX's, within rounds."""
    out: dict[str, dict[str, list[float]]] = {}
    for variant, results in runs.items():
        out[variant] = {}
        for baseline in ("stock", "SBX"):
            if baseline in runs and baseline != variant:
                per_round = [r[kind] / b[kind] for r, b in zip(results, runs[baseline])]
                out[variant][f"vs {baseline}"] = list(ratio_ci(per_round))
    return out


def best_stock(task_result: dict[str, Any], kind: str = "steady") -> str | None:
    """The faster of stock's thread counts (the peer a user who tunes threads would pick), where measured."""
    runs = task_result["runs"]
    candidates = [v for v in ("stock", "stock 1-thread") if v in runs]
    return min(candidates, key=lambda v: _median(r[kind] for r in runs[v])) if candidates else None


def _median(values) -> float:
    return float(statistics.median(values))


def label(key: str, data: dict[str, Any]) -> str:
    """A section's name from what it records and what ran beside it
    ("dqn-cartpole, beside 1 busy process" → "SB3 DQN CartPole-v1, beside 1 busy process")."""
    _, comma, rest = key.partition(", ")
    return f"SB3 {data['algo'].upper()} {data['env_id']}" + comma + rest


def headline_variant(runs: dict[str, list[dict[str, float]]]) -> str:
    """The drop-in a user of the README's two lines gets ("drop-in"), or the fastest where that was not run."""
    if "drop-in" in runs:
        return "drop-in"
    return min((v for v in runs if v.startswith("drop-in")), key=lambda v: _median(r["steady"] for r in runs[v]))


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per section and variant: what the results page shows (medians, ratios with their CI, the first
    round's end to end with what the compiled step cost in it)."""
    rows = []
    for key, data in results["tasks"].items():
        chosen = headline_variant(data["runs"])
        for variant, runs in data["runs"].items():
            steady, e2e = data["ratios"]["steady"][variant], data["ratios"]["end_to_end"][variant]
            rows.append({"task": key, "label": label(key, data), "variant": variant, "headline": variant == chosen,
                         "new_processes": bool(data.get("new_processes")), "busy": data.get("busy", 0),
                         "steady_s": _median(r["steady"] for r in runs),
                         "end_to_end_s": _median(r["end_to_end"] for r in runs),
                         "first_run_s": runs[0]["end_to_end"], "first_run_compiled": runs[0].get("compiled", []),
                         "steady_vs_stock": steady.get("vs stock"), "steady_vs_sbx": steady.get("vs SBX"),
                         "end_to_end_vs_sbx": e2e.get("vs SBX")})
    return rows


def headline(rows: list[dict[str, Any]]) -> str:
    """The results page's figure of a run (its :func:`summary_rows`): its first section's headline drop-in
    against SBX (else stock)."""
    row = next(r for r in rows if r["headline"])
    ratio, peer = (row["steady_vs_sbx"], "SBX") if row["steady_vs_sbx"] else (row["steady_vs_stock"], "stock")
    return f"{row['label']} `learn()`, {row['variant']}: {ratio[0]:.2f}x {peer}'s time"


def table(results: dict[str, Any]) -> str:
    lines = []
    for name, data in results["tasks"].items():
        lines.append(f"{name} ({data['steps']:,} env steps after a {data['warmup']:,}-step warm-up; "
                     f"best stock: {best_stock(data)})")
        lines.append(f"  {'variant':<28} {'steady s':>9} {'vs stock':>20} {'vs SBX':>20} {'end to end s':>13} "
                     f"{'vs SBX':>20}")
        for variant, results_ in data["runs"].items():
            steady, e2e = _median(r["steady"] for r in results_), _median(r["end_to_end"] for r in results_)
            r_steady, r_e2e = data["ratios"]["steady"][variant], data["ratios"]["end_to_end"][variant]
            lines.append(f"  {variant:<28} {steady:9.2f} {_ratio(r_steady.get('vs stock')):>20} "
                         f"{_ratio(r_steady.get('vs SBX')):>20} {e2e:13.2f} {_ratio(r_e2e.get('vs SBX')):>20}")
    return "\n".join(lines)


def _ratio(values: list[float] | None) -> str:
    return "—" if values is None else f"{values[0]:.2f}x [{values[1]:.2f}, {values[2]:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", default=None, help="the fixed work: env steps for every task, or per task "
                        "as dqn-cartpole=20000,sac-pendulum=1500 (default: the task's)")
    parser.add_argument("--name", default="peers", help="the results file's name in --out (default: peers.json)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up env steps (default: the task's)")
    parser.add_argument("--out", default=None, help="folder for peers.json (default: print only)")
    parser.add_argument("--busy", default="0", help="comma-separated counts of busy processes to run beside "
                        "(each count measures every variant again, in its own section), e.g. 0,1,2")
    parser.add_argument("--new-processes", action="store_true",
                        help="each run in a new process (nothing compiled in memory: a later run on the machine)")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    for value, known, flag in ((tasks, TASKS, "--tasks"), (wanted, VARIANTS, "--variants")):
        unknown = [v for v in value if v not in known]
        if unknown:
            parser.error(f"{flag} must name {', '.join(known)}; got {', '.join(unknown)}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got --rounds={args.rounds}")
    command = _results.command("peers", argv)
    print(f"$ {command}\n{machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
          + ("" if sbx_available() else "; SBX not installed (pip install -e '.[peers]')"), flush=True)
    results: dict[str, Any] = {"tasks": {}}
    busy_counts = [int(b) for b in args.busy.split(",") if b.strip()]
    for name in tasks:
        task = TASKS[name]
        steps, warmup = _steps_for(args.steps, name, parser) or task.steps, args.warmup or task.warmup
        for busy in busy_counts:
            key = name if busy == 0 else f"{name}, beside {busy} busy process{'es' if busy > 1 else ''}"
            with busy_processes(busy):
                results["tasks"][key] = measure(key, task, variants_for(task, wanted), args.rounds, steps, warmup,
                                                args.new_processes)
            results["tasks"][key]["busy"] = busy
    print(table(results))
    rows = summary_rows(results)
    _results.write(args.out, "peers", name=args.name, argv=argv, headline=headline(rows), rows=rows,
                   tasks=results["tasks"], peer_versions=_versions())
    return 0


def _steps_for(value: str | None, task: str, parser: argparse.ArgumentParser) -> int | None:
    """``--steps`` for ``task``: one count for all, or ``task=count`` pairs (None: the task's own)."""
    if not value:
        return None
    pairs = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    text = pairs.get(task) if pairs else value
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        parser.error(f"--steps must be a positive count or task=count pairs, got --steps={value}")
    return int(text)


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` other processes each keeping a core busy (a pure-Python loop), as other training runs on
    the machine would, for the time of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "stable-baselines3", "sbx-rl", "jax"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    return out


if __name__ == "__main__":
    raise SystemExit(main())
