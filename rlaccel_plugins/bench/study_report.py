"""The learning study's report: ``stats.json``, ``report.md`` and the plots, from ``runs.jsonl``.

Also reads ``speed.json`` when the study's speed measure has been run into the same folder
(:mod:`rlaccel_plugins.bench.speed`): time to threshold is then derived as env steps to threshold
(from the learning runs) over env steps per second of ``learn()`` (from the speed measure).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from rlaccel_plugins.bench import learning_stats as ls
from rlaccel_plugins.bench.study import (
    ANNEAL,
    ARTICLE,
    CER,
    COMPILED,
    ERE,
    LEGACY_NAMES,
    NO_ARGUMENT,
    RUNS_FILE,
    SPARSE_DENSE,
    STOCK,
    TASKS,
    TIERS,
    UNIFORM,
    VOLUME_STEPS,
    read_runs,
    study_commands,
    volume_base,
)
from rlaccel_plugins.errors import ConfigError

RANDOM_FILE = "random_returns.json"
MIN_RUNS = 5  # below this a bootstrap CI's width says little about how many runs a decision needs
SCREEN_SEEDS = 10  # a decision screens on seeds 0-9 and is confirmed on the seeds after them, fresh ones
# the comparisons that matter: every drop-in against stock; every non-uniform scheme against uniform
PAIRS = [(v, STOCK) for v in (UNIFORM, TIERS, ARTICLE, NO_ARGUMENT, ERE, CER, ANNEAL, SPARSE_DENSE)] + \
        [(v, UNIFORM) for v in (TIERS, ARTICLE, NO_ARGUMENT, ERE, CER, ANNEAL, COMPILED, SPARSE_DENSE)]
# P(X > Y) on each: the area, its two halves, the last evaluation, the area over the task's first seconds of training
MEASURES = ("auc", "early", "late", "final", "auc_time")


def random_return(env_id: str, episodes: int = 100, seed: int = 0) -> float:
    """Mean return of uniformly random actions over ``episodes`` (the normalised score's 0)."""
    import gymnasium as gym

    from rlaccel_plugins.tasks import ensure_registered

    ensure_registered(env_id)  # MinAtar's games register on demand
    env = gym.make(env_id)
    env.action_space.seed(seed)
    total = 0.0
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes


def random_key(env_id: str) -> str:
    """The cache key of ``env_id``'s random return: the env and the gymnasium version that defines it."""
    from importlib.metadata import version

    return f"{env_id} (gymnasium {version('gymnasium')})"


def random_returns(out: Path, env_ids: set[str]) -> dict[str, float]:
    """``{env_id: random return}``, cached in ``out/random_returns.json`` by env id and gymnasium version."""
    path = out / RANDOM_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    for env_id in sorted(env_ids):
        if random_key(env_id) not in known:
            known[random_key(env_id)] = random_return(env_id)
    path.write_text(json.dumps(known, indent=2, sort_keys=True))
    return {env_id: known[random_key(env_id)] for env_id in env_ids}


def _task_of(key: str):
    return next((t for t in TASKS.values() if t.key == key), None)


def _sampled(runs: list[dict[str, Any]]) -> str:
    """What a variant's runs sampled, as one line; ``mixed: ...`` when they differ (the report then refuses to
    compare it)."""
    seen = []
    for record in runs:
        shown = _describe(record.get("replay_sampling"))
        if shown not in seen:
            seen.append(shown)
    return seen[0] if len(seen) == 1 else "mixed: " + " / ".join(seen)


def _describe(sampling: dict[str, Any] | None) -> str:
    if not sampling:
        return "not recorded"
    if sampling["sampling"] != "tiers":
        return sampling["sampling"]
    ratios = "/".join(f"{r:g}" for r in sampling["sampling_ratio"])
    shares = "/".join(f"{c / sum(sampling['level_capacity']):.1%}" for c in sampling["level_capacity"])
    return f"tiers {ratios} of {shares}" + ("" if sampling.get("ratio_schedule", "constant") == "constant"
                                             else f", {sampling['ratio_schedule']}")


def time_horizon(runs: list[dict[str, Any]]) -> float | None:
    """The seconds of training every run of a task covers (the shortest run's, to its last evaluation): the span
    its area over time is taken on. None where a run has no timed evaluation."""
    ends = [r["curve"][-1].get("train_seconds") for r in runs if r.get("curve")]
    if not ends or any(e is None or not e > 0 for e in ends):
        return None
    return float(min(ends))


def split_seeds(runs: list[dict[str, Any]]) -> list[int]:
    """The seeds whose runs of one task ran on more than one machine (``provenance.machine``): their times differ
    by machine as well as by variant, so no time-based measure may compare them.

    Examples:
        >>> run = lambda seed, machine: {"seed": seed, "provenance": {"machine": machine}}
        >>> split_seeds([run(0, "a"), run(0, "a"), run(1, "a"), run(1, "b"), run(2, "b")])
        [1]
    """
    machines: dict[int, set[str]] = {}
    for r in runs:
        machines.setdefault(r["seed"], set()).add(r.get("provenance", {}).get("machine", ""))
    return sorted(seed for seed, names in machines.items() if len(names) > 1)


def _failed_seeds(records: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """Per (task, variant): the seeds that failed and never finished (a failed run retried to success is not lost)."""
    ok = {(r["task"], r["variant"], r["seed"]) for r in records if r.get("status") == "ok"}
    lost = {(r["task"], r["variant"], r["seed"]) for r in records if r.get("status") == "failed"} - ok
    counts: dict[tuple[str, str], int] = {}
    for task, variant, _ in lost:
        counts[task, variant] = counts.get((task, variant), 0) + 1
    return counts


def _compare(x: list[dict[str, float]], y: list[dict[str, float]], reps: int) -> dict[str, tuple[float, float, float]]:
    return {m: ls.probability_of_improvement(np.array([s[m] for s in x]), np.array([s[m] for s in y]), reps)
            for m in MEASURES if all(math.isfinite(s[m]) for s in [*x, *y])}


def analyse(records: list[dict[str, Any]], randoms: dict[str, float], speed: dict[str, Any] | None = None,
            reps: int = ls.REPS) -> dict[str, Any]:
    """Scores, IQMs, probabilities of improvement (on the area, its halves and the final evaluation) and the
    per-family decisions from a study's records (``status`` ok or failed: failed runs and runs with a
    non-finite score are counted and shown, never compared; a comparison involving them is refused)."""
    failed = _failed_seeds(records)
    by_task: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for record in records:
        if record.get("status", "ok") == "ok":
            by_task.setdefault(record["task"], {}).setdefault(record["variant"], []).append(record)
    for (key, variant) in failed:
        by_task.setdefault(key, {}).setdefault(variant, [])
    tasks_out: dict[str, Any] = {}
    scores_of: dict[str, dict[str, dict[int, dict[str, float]]]] = {}
    for key, variants in by_task.items():
        task = _task_of(key)
        order = [v.name for v in task.variants] if task else []
        variants = dict(sorted(variants.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
        some = next((r for runs in variants.values() for r in runs), None)
        if some is None:  # every run of this task failed
            tasks_out[key] = {"rows": {v: {"runs": 0, "failed": failed.get((key, v), 0)} for v in variants},
                              "pairs": {}}
            continue
        env_id = some.get("env_id") or (task.env_id if task else key.split()[-1])
        threshold = task.threshold if task else some["threshold"]
        random = randoms[env_id]
        if not threshold > random:
            raise ConfigError(f"threshold must lie above the random policy's return on {env_id} ({random:g}): the "
                              f"normalised score divides by their difference, got threshold={threshold:g} for task "
                              f"{key!r}. Set a threshold a trained agent reaches and a random one does not.")
        budget = max(r.get("budget", r.get("cap", 0)) for rs in variants.values() for r in rs)
        horizon = time_horizon([r for runs in variants.values() for r in runs])
        scores_of[key] = {v: {r["seed"]: ls.run_scores(r["curve"], random, threshold, budget, horizon) for r in runs}
                          for v, runs in variants.items()}
        rows, valid = {}, {}
        for v, runs in variants.items():
            by_seed = scores_of[key][v]
            valid[v] = [by_seed[s] for s in sorted(by_seed) if math.isfinite(by_seed[s]["auc"])]
            steps = np.array([s["steps_to_threshold"] for s in valid[v]])
            rows[v] = {"runs": len(runs), "failed": failed.get((key, v), 0), "invalid": len(runs) - len(valid[v]),
                       "sampled": _sampled(runs), "reached": int(np.isfinite(steps).sum())}
            if valid[v]:
                rows[v].update(
                    iqm_auc=ls.iqm_with_ci({v: np.array([s["auc"] for s in valid[v]])}, reps)[v],
                    iqm_final=ls.iqm_with_ci({v: np.array([s["final"] for s in valid[v]])}, reps)[v],
                    steps_to_threshold=ls.steps_to_threshold_ci(steps, reps))
        pairs = {}
        for x, y in PAIRS:
            if x not in rows or y not in rows:
                continue
            entry: dict[str, Any] = {"runs": (rows[x]["runs"], rows[y]["runs"])}
            refused = _refusal(rows, (x, y))
            if refused:
                entry["refused"] = refused
            if valid[x] and valid[y]:
                entry.update(poi_by=_compare(valid[x], valid[y], reps))
                point, low, high = entry["poi"] = entry["poi_by"]["auc"]
                entry["seeds_needed"] = ls.seeds_for_decision(min(len(valid[x]), len(valid[y])), low, high, point)
            pairs[f"{x} > {y}"] = entry
        tasks_out[key] = {"env_id": env_id, "threshold": threshold, "random": random, "rows": rows, "pairs": pairs,
                          "budget": budget, "horizon_s": horizon,
                          "split_seeds": split_seeds([r for runs in variants.values() for r in runs])}
        if speed and key in speed:
            _derive_time(tasks_out[key], speed[key])
    ok = [r for r in records if r.get("status", "ok") == "ok"]
    cost = {"ok_runs": len(ok), "failed_attempts": len(records) - len(ok),
            "worker_hours": sum(r.get("worker_seconds", 0.0) for r in records) / 3600}
    return {"tasks": tasks_out, "aggregate": _aggregate(scores_of, tasks_out, reps),
            "decisions": _decisions(scores_of, tasks_out, reps),
            "schedule_decisions": _schedule_decisions(scores_of, tasks_out, reps), "cost": cost}


def _refusal(rows: dict[str, dict[str, Any]], variants) -> str | None:
    """Why the runs of ``variants`` cannot decide anything, or None: failed runs, non-finite scores, or runs of one
    variant that sampled differently."""
    reasons = []
    for v in variants:
        row = rows[v]
        if row.get("failed"):
            reasons.append(f"{row['failed']} failed run(s) of {v}")
        if row.get("invalid"):
            reasons.append(f"{row['invalid']} run(s) of {v} with no finite score")
        if row.get("sampled", "").startswith("mixed"):
            reasons.append(f"the runs of {v} sampled differently ({row['sampled']})")
    return "; ".join(reasons) or None


def family_of(key: str) -> str | None:
    """The algorithm family (``sb3 DQN``) of study task ``key``, the decision table's row; None for a task no
    longer in the study."""
    from rlaccel_plugins.tasks import task_info

    task = _task_of(key)
    if task is None:
        return None
    return f"{task.framework} {task.algo.upper()}" + (" (images)" if task_info(task.env_id).pixels else "")


def _family_tasks(tasks_out: dict[str, Any], pair: tuple[str, str] = (ARTICLE, UNIFORM)) -> dict[str, list[str]]:
    """The study tasks of each algorithm family that ran both variants of ``pair`` (default: the article's tiers
    and uniform sampling) at the family's own recipe (a sweep point, whose recipe changed, is left out)."""
    families: dict[str, list[str]] = {}
    for key in sorted(tasks_out):
        task, family = _task_of(key), family_of(key)
        if family is not None and not task.sweep and set(pair) <= tasks_out[key]["rows"].keys():
            families.setdefault(family, []).append(key)
    return families


def _pooled(scores_of, keys: list[str], x: str, y: str, seeds: list[int], reps: int,
            measures: tuple[str, ...] = MEASURES):
    """P(x > y) per measure over ``keys`` together (tasks as strata) on ``seeds``."""
    def matrix(variant: str, measure: str) -> np.ndarray:
        return np.array([[scores_of[k][variant][s][measure] for k in keys] for s in seeds])

    finite = [m for m in measures if np.isfinite(matrix(x, m)).all() and np.isfinite(matrix(y, m)).all()]
    return {m: ls.probability_of_improvement(matrix(x, m), matrix(y, m), reps) for m in finite}


def _shared_seeds(scores_of, keys: list[str], variants: list[str]) -> list[int]:
    """The seeds every listed variant ran on every listed task (stratified bootstrap needs a matrix)."""
    sets = [set(scores_of[k].get(v, {})) for k in keys for v in variants]
    return sorted(set.intersection(*sets)) if sets else []


def _aggregate(scores_of, tasks_out, reps: int) -> dict[str, Any]:
    """Across the family tasks: IQM of the area score and P(X > Y) for each pair, over the seeds all share."""
    keys = sorted(k for ks in _family_tasks(tasks_out).values() for k in ks)
    if len(keys) < 2:
        return {}
    every = [v for v in (STOCK, UNIFORM, ARTICLE) if all(v in scores_of[k] for k in keys)]
    seeds = _shared_seeds(scores_of, keys, every)
    if len(seeds) < 3 or any(_refusal(tasks_out[k]["rows"], every) for k in keys):
        return {}
    areas = {v: np.array([[scores_of[k][v][s]["auc"] for k in keys] for s in seeds]) for v in every}
    pairs = {f"{x} > {y}": _pooled(scores_of, keys, x, y, seeds, reps) for x, y in PAIRS if x in every and y in every}
    return {"tasks": keys, "seeds": len(seeds), "iqm_auc": ls.iqm_with_ci(areas, reps), "pairs": pairs}


def _screened(scores_of, tasks_out, pair: tuple[str, str], measure: str, reps: int) -> dict[str, Any]:
    """Per algorithm family, whether ``pair[0]`` beats ``pair[1]`` on ``measure``: P(x > y) over the family's
    tasks together above 0.5 on the screening seeds (0-9), then confirmed on fresh seeds (10 on) with a 95% CI
    lower bound above 0.5. Each entry's ``chosen`` is the winner (``pair[1]`` unless x is screened and
    confirmed) and ``why``; failed or non-finite runs refuse a decision (``pair[1]`` stays)."""
    x, y = pair
    out = {}
    for family, keys in _family_tasks(tasks_out, pair).items():
        seeds = _shared_seeds(scores_of, keys, list(pair))
        if len(seeds) < 3:
            continue
        screen = [s for s in seeds if s < SCREEN_SEEDS]
        confirm = [s for s in seeds if s >= SCREEN_SEEDS]
        entry: dict[str, Any] = {"tasks": keys, "seeds": len(seeds), "screen_seeds": len(screen),
                                 "confirm_seeds": len(confirm), "measure": measure,
                                 "all": _pooled(scores_of, keys, x, y, seeds, reps)}
        if screen:
            entry["screen"] = _pooled(scores_of, keys, x, y, screen, reps, (measure,)).get(measure)
        if len(confirm) >= 3:
            entry["confirm"] = _pooled(scores_of, keys, x, y, confirm, reps, (measure,)).get(measure)
        refused = next(filter(None, (_refusal(tasks_out[k]["rows"], pair) for k in keys)), None)
        split = [f"{k} (seeds {', '.join(map(str, tasks_out[k]['split_seeds']))})" for k in keys
                 if tasks_out[k]["split_seeds"]]
        if measure == "auc_time" and split and not refused:
            refused = "runs of one seed on different machines: " + "; ".join(split)
        if refused:
            entry.update(chosen=y, why=f"refused: {refused}")
        elif len(screen) < SCREEN_SEEDS:
            entry.update(chosen=y, why=f"screen incomplete: {len(screen)} of its {SCREEN_SEEDS} seeds")
        elif entry.get("screen") is None:
            entry.update(chosen=y, why=f"refused: no finite {measure} on every screening run")
        elif entry["screen"][0] <= 0.5:
            entry.update(chosen=y, why="the screen shows no gain")
        elif "confirm" not in entry:
            entry.update(chosen=y, why="screened, not confirmed yet: needs fresh seeds")
        elif entry["confirm"][1] > 0.5:
            entry.update(chosen=x, why="screened and confirmed on fresh seeds")
        else:
            entry.update(chosen=y, why="not confirmed on fresh seeds")
        out[family] = entry
    return out


def _decisions(scores_of, tasks_out, reps: int) -> dict[str, Any]:
    """Per algorithm family: sample by the article's tiers only where :func:`_screened` chooses them over uniform
    sampling on the area (``sampling``: ``tiers`` or ``uniform``)."""
    out = _screened(scores_of, tasks_out, (ARTICLE, UNIFORM), "auc", reps)
    for entry in out.values():
        entry["sampling"] = "tiers" if entry.pop("chosen") == ARTICLE else "uniform"
    return out


def _schedule_decisions(scores_of, tasks_out, reps: int) -> dict[str, Any]:
    """Per algorithm family that ran it: keep the sparse/dense schedule (in the presets that carry it) only where
    :func:`_screened` chooses it over every update full, both sampling uniformly, on the area over time — what
    the schedule claims is time (``schedule``: ``sparse/dense`` or ``full``)."""
    out = _screened(scores_of, tasks_out, (SPARSE_DENSE, UNIFORM), "auc_time", reps)
    for entry in out.values():
        entry["schedule"] = "sparse/dense" if entry.pop("chosen") == SPARSE_DENSE else "full"
    return out


def _derive_time(task: dict[str, Any], speed: dict[str, Any]) -> None:
    """Time to threshold = env steps to threshold / env steps per second of ``learn()`` (speed measure)."""
    stock_rate = speed.get(STOCK, {}).get("env_steps_per_s")
    stock_steps = task["rows"].get(STOCK, {}).get("steps_to_threshold", (math.inf,))[0]
    for variant, row in task["rows"].items():
        rate = speed.get(variant, {}).get("env_steps_per_s")
        if not rate:
            continue
        steps = row["steps_to_threshold"][0]
        row["speed"] = speed[variant]
        row["derived_seconds"] = steps / rate
        if stock_rate and math.isfinite(stock_steps) and math.isfinite(steps):
            row["derived_time_vs_stock"] = (steps / rate) / (stock_steps / stock_rate)


# ------------------------------------------------------------------ writing
def _ci(value: tuple[float, float, float] | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    point, low, high = value
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _steps(value: tuple[float, float, float] | None) -> str:
    def show(x: float) -> str:
        return f"{x / 1000:.1f}k" if math.isfinite(x) else "not reached"

    return "—" if value is None else f"{show(value[0])} [{show(value[1])}, {show(value[2])}]"


EXPLAINED = (
    "Scores are normalised per task (0 = a random policy's mean return, 1 = the task's threshold). "
    "*Area* is the mean normalised evaluation return over the budget (10 deterministic episodes per "
    "evaluation, evenly spaced); *first half* and *second half* are the same over the evaluations in each "
    "half of the budget (an area can hide a crossing: worse early, better late); *final* is the last "
    "evaluation; *area over time* is the mean normalised return over the task's first seconds of training (the "
    "shortest run's, evaluations excluded), each evaluation holding until the next and 0 before the first: what a "
    "faster update buys (one run per worker process beside another: times carry the host's noise). "
    "IQM = interquartile mean over runs, with a 95% stratified-bootstrap CI (rliable, seeded: "
    "the same runs give the same report). P(X > Y) is the probability that a run of X scores higher than a "
    "run of Y, with its 95% CI: an interval containing 0.5 means the runs cannot tell the two apart. Failed "
    "runs and runs without a finite score are counted, and refuse any comparison they are part of. The "
    "drop-in variants learn through the drop-in itself (fused updates, lean collection: the framework's "
    "computation, bit for bit), stock through the framework's own code; each run records the sampling its "
    "buffer resolved (*sampled*: the tiers' ratios, then each level's share of the capacity).")


def _count(n: float) -> str:
    return "—" if not math.isfinite(n) else f"{n:,.0f}"


def _poi(pair: dict[str, Any] | None, measure: str = "auc") -> str:
    if pair is None:
        return "—"
    if pair.get("refused"):
        return "refused"
    return _ci(pair["poi_by"].get(measure)) if "poi_by" in pair else "—"


def summary_table(stats: dict[str, Any]) -> str:
    """One row per task and variant: the area score's IQM, P(X > stock), P(X > uniform) and the speed ratio,
    each with its 95% CI (the README's table)."""
    lines = ["| task | variant | runs | IQM area | P(X > stock) | P(X > uniform) | speed vs stock |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for key, task in stats["tasks"].items():
        for variant, row in task["rows"].items():
            poi = {b: _poi(task["pairs"].get(f"{variant} > {b}")) for b in (STOCK, UNIFORM)}
            speed = row.get("speed", {}).get("vs_stock")
            lines.append(f"| {key} | {variant} | {row['runs']} | {_ci(row.get('iqm_auc'))} | {poi[STOCK]} | "
                         f"{poi[UNIFORM]} | "
                         + (f"{_ci(speed)}x |" if speed else "1 |" if variant == STOCK and "speed" in row else "— |"))
    return "\n".join(lines)


def _decided_table(decided: dict[str, Any], measures: tuple[tuple[str, str], ...], outcome: tuple[str, str]) -> str:
    """A :func:`_screened` decision per row: the family, its tasks, its seeds, P(X > Y) over all seeds on each of
    ``measures`` (``(header, measure)``), the screen, the confirmation, and ``outcome`` (``(header, entry key)``)."""
    header = ["family", "tasks", "seeds (screen + fresh)", *(h for h, _ in measures), "screen (seeds 0-9)",
              "confirmation (fresh seeds)", outcome[0]]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(measures) + 3) + "---|"]
    for family, d in decided.items():
        cells = [family, ", ".join(k.split(" ", 2)[-1] for k in d["tasks"]), f"{d['screen_seeds']} + {d['confirm_seeds']}",
                 *(_ci(d["all"].get(m)) for _, m in measures), _ci(d.get("screen")), _ci(d.get("confirm")),
                 f"**{d[outcome[1]]}**: {d['why']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decision_table(stats: dict[str, Any]) -> str:
    """One row per algorithm family: its tasks, seeds, P(article tiers > uniform) on every measure, the screen
    and the confirmation, and what the no-argument default samples for it (the docs' table)."""
    return _decided_table(stats.get("decisions", {}), (("P area, all seeds", "auc"), ("first half", "early"),
                          ("second half", "late"), ("final", "final")), ("default samples", "sampling"))


def schedule_table(stats: dict[str, Any]) -> str:
    """One row per algorithm family that ran the sparse/dense schedule: P(sparse/dense > every update full) over
    its tasks on the area over time (the decision's measure) and per env step, the screen, the confirmation, and
    what the presets that carry the schedule do (the docs' table)."""
    return _decided_table(stats.get("schedule_decisions", {}), (("P area over time, all seeds", "auc_time"),
                          ("P area per env step", "auc"), ("final", "final")), ("schedule", "schedule"))


def volume_rows(stats: dict[str, Any]) -> list[tuple[int, float, dict[str, Any]]]:
    """The replay-volume sweep's points: ``(gradient_steps, samples per env step, P(article tiers > uniform)
    entry)``, the study's own CartPole DQN task as the sweep's base point."""
    base = volume_base()
    points = [(base["gradient_steps"], TASKS["cartpole-dqn"].key)] + [
        (g, TASKS[f"cartpole-dqn-gs{g}"].key) for g in VOLUME_STEPS]
    rows = []
    for steps, key in sorted(points):
        pair = stats["tasks"].get(key, {}).get("pairs", {}).get(f"{ARTICLE} > {UNIFORM}")
        if pair and "poi_by" in pair:
            rows.append((steps, steps * base["batch_size"] / base["train_freq"], pair))
    return rows


def volume_table(stats: dict[str, Any]) -> str:
    """The replay-volume sweep as a table (the docs include it): P(article tiers > uniform) per point."""
    per = volume_base()["train_freq"]
    lines = [(f"| gradient steps per {per} env steps | samples per env step | runs | P area | first half | second half "
              "| final |"), "|---:|---:|---:|---:|---:|---:|---:|"]
    for steps, samples, pair in volume_rows(stats):
        lines.append(f"| {steps} | {samples:g} | {min(pair['runs'])} | {_poi(pair)} | {_poi(pair, 'early')} | "
                     f"{_poi(pair, 'late')} | {_poi(pair, 'final')} |")
    return "\n".join(lines)


def markdown(stats: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"# Learning study: {meta.get('study', '')}", "",
             (f"Commands, in order: {'; '.join(f'`{c}`' for c in study_commands(meta))}; updated "
              f"{meta.get('updated', '')}; {'machines' if ';' in meta.get('machine', '') else 'machine'}: "
              f"{meta.get('machine', '')}."),
             "",
             EXPLAINED, ""]
    cost = stats.get("cost")
    if cost:
        lines += [(f"{cost['ok_runs']} runs finished ({cost['failed_attempts']} failed attempts); they took "
                   f"{cost['worker_hours']:.1f} worker-hours (one run per worker process, one torch thread each: "
                   f"about {cost['worker_hours'] / 2:.1f} h on 2 cores)."), ""]
    lines += ["## Summary", "", summary_table(stats), ""]
    if stats.get("decisions"):
        lines += ["## What the no-argument default samples, per algorithm family", "",
                  ("P(article tiers > uniform) over each family's tasks together. A family samples by the article's "
                   "tiers only where the screen (seeds 0-9) favours them and fresh seeds (10 on) confirm it with a 95% "
                   "CI lower bound above 0.5; every other family samples uniformly."), "", decision_table(stats), ""]
    if stats.get("schedule_decisions"):
        lines += ["## Whether the presets keep the sparse/dense schedule, per algorithm family", "",
                  ("P(uniform + sparse/dense > uniform, every update full) over each family's tasks together, on the "
                   "area over time: the schedule trains fewer layers on most steps to save time, so time is its "
                   "claim. A preset keeps it only where the screen (seeds 0-9) favours it and fresh seeds (10 on) "
                   "confirm it with a 95% CI lower bound above 0.5."), "", schedule_table(stats), ""]
    for key, task in stats["tasks"].items():
        if "budget" not in task:
            lines += [f"## {key}", "", "Every run of this task failed: " + ", ".join(
                f"{v} ({row['failed']})" for v, row in task["rows"].items()) + ".", ""]
            continue
        timed = any("speed" in r for r in task["rows"].values())
        lines += [f"## {key}", "",
                  (f"Budget {task['budget']:,} env steps; threshold {task['threshold']:g}; random policy "
                   f"{task['random']:.1f}" + (f"; area over time: the first {task['horizon_s']:,.0f} s of training "
                                             "(the shortest run's)." if task.get("horizon_s") else ".")
                   + (f" Seeds {', '.join(map(str, task['split_seeds']))} ran their variants on different machines: "
                      "their times differ by machine as well as by variant (re-run them on one machine: move their "
                      "records aside and `--resume`)." if task.get("split_seeds") else "")), "",
                  ("| variant | sampled | runs | failed / no score | IQM area | IQM final | reached | env steps to "
                   "threshold (median) |" + (" speed vs stock | derived time vs stock |" if timed else "")),
                  "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if timed else "")]
        for variant, row in task["rows"].items():
            line = (f"| {variant} | {row['sampled']} | {row['runs']} | {row['failed']} / {row['invalid']} | "
                    f"{_ci(row.get('iqm_auc'))} | {_ci(row.get('iqm_final'))} | {row['reached']}/{row['runs']} | "
                    f"{_steps(row.get('steps_to_threshold'))} |")
            if "speed" in row:
                ratio = row["speed"].get("vs_stock")
                line += (f" {_ci(ratio)}x |" if ratio else " — |") + (
                    f" {row['derived_time_vs_stock']:.2f}x |" if "derived_time_vs_stock" in row else " — |")
            elif timed:
                line += " — | — |"
            lines.append(line)
        lines += ["", ("| P(X > Y) | runs | area | first half | second half | final | area over time | area: runs "
                       "per variant to decide, observed effect / P = 0.6 |"), "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for pair, value in task["pairs"].items():
            if value.get("refused"):
                lines.append(f"| {pair} | {value['runs'][0]} | refused: {value['refused']} | | | | | |")
                continue
            need = value.get("seeds_needed")
            needed = f"{_count(need['observed'])} / {_count(need['effect'])}" \
                if need and min(value["runs"]) >= MIN_RUNS else "too few runs to say"
            lines.append(f"| {pair} | {value['runs'][0]} | {_poi(value)} | {_poi(value, 'early')} | "
                         f"{_poi(value, 'late')} | {_poi(value, 'final')} | {_poi(value, 'auc_time')} | {needed} |")
        lines.append("")
    aggregate = stats.get("aggregate") or {}
    if aggregate:
        lines += [f"## The family tasks together ({aggregate['seeds']} seeds each: {', '.join(aggregate['tasks'])})",
                  "", "| variant | IQM area |", "|---|---:|"]
        lines += [f"| {v} | {_ci(value)} |" for v, value in aggregate["iqm_auc"].items()]
        lines += ["", "| P(X > Y) | area | first half | second half | final |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {pair} | {_ci(v['auc'])} | {_ci(v['early'])} | {_ci(v['late'])} | {_ci(v['final'])} |"
                  for pair, v in aggregate["pairs"].items()]
        lines.append("")
    return "\n".join(lines)


def slug(task: str) -> str:
    """A task's name in a file name.

    Examples:
        >>> slug("sb3 DQN CartPole-v1, gradient_steps=16")
        'sb3-dqn-cartpole-v1-gradient_steps-16'
    """
    import re

    return re.sub(r"[^a-z0-9_.]+", "-", task.lower()).strip("-")


def plot(records: list[dict[str, Any]], stats: dict[str, Any], out: Path) -> list[Path]:
    """IQM sample-efficiency curves with 95% CI bands (``iqm-<task>.png``, one figure per task) and the P(X > Y)
    chart (``probability_of_improvement.png``)."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for old in out.glob("iqm-*.png"):  # a task no longer in the runs leaves no stale figure
        old.unlink()
    for key in [k for k, t in stats["tasks"].items() if "budget" in t]:
        task = stats["tasks"][key]
        curves: dict[str, list] = {}
        steps: list[int] = []
        for record in records:
            if record["task"] != key or record.get("status", "ok") != "ok" or not record["curve"]:
                continue
            points = record["curve"]
            steps = [p["env_steps"] for p in points] if len(points) > len(steps) else steps
            curve = ls.normalised([p["mean_reward"] for p in points], task["random"], task["threshold"])
            if np.isfinite(curve).all():
                curves.setdefault(record["variant"], []).append(curve)
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        length = min(len(c) for cs in curves.values() for c in cs)
        matrices = {v: np.array([c[:length] for c in cs]) for v, cs in curves.items()}
        points, intervals = ls.iqm_curves(matrices)
        x = np.array(steps[:length]) / 1000
        for variant, runs in matrices.items():
            ax.plot(x, points[variant], label=f"{variant} ({len(runs)} runs)")
            ax.fill_between(x, intervals[variant][0], intervals[variant][1], alpha=0.2)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--", label=f"threshold ({task['threshold']:g})")
        ax.axhline(0.0, color="grey", lw=0.6, ls=":", label=f"random policy ({task['random']:g})")
        counts = sorted({len(m) for m in matrices.values()})
        shown = f"{counts[0]} runs each" if len(counts) == 1 else f"{counts[0]}-{counts[-1]} runs"
        ax.set_title(f"{key} ({shown}; bands: 95% CIs)", fontsize=9)
        ax.set_xlabel("env steps (thousands)")
        ax.set_ylabel("IQM normalised return (0 = random, 1 = threshold)")
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        path = out / f"iqm-{slug(key)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    pairs = [(key, pair, value["poi"]) for key, task in stats["tasks"].items() for pair, value in task["pairs"].items()
             if "poi" in value and not value.get("refused")]
    if pairs:
        fig, ax = plt.subplots(figsize=(8, 0.28 * len(pairs) + 1.2))
        for i, (key, pair, (point, low, high)) in enumerate(pairs):
            colour = "tab:green" if low > 0.5 else "tab:red" if high < 0.5 else "tab:grey"
            ax.plot([low, high], [i, i], color=colour, lw=4, alpha=0.6)
            ax.plot([point], [i], "k|", ms=10)
        ax.set_yticks(range(len(pairs)), [f"{key}: {pair}" for key, pair, _ in pairs], fontsize=7)
        ax.axvline(0.5, color="grey", ls="--", lw=0.8)
        ax.set_xlim(0, 1)
        ax.set_xlabel("P(X > Y), area score, with 95% CI (green: X better, red: X worse, grey: undecided)")
        ax.invert_yaxis()
        path = out / "probability_of_improvement.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")  # the long pair labels stay inside the image
        plt.close(fig)
        written.append(path)
    return written


def write_report(out: str | Path, reps: int = ls.REPS) -> dict[str, Any]:
    """Read ``out/runs.jsonl`` (and ``speed.json``), write ``stats.json``, ``report.md`` and the plots.

    The same runs give the same files, byte for byte (the bootstrap is seeded; nothing is dated but
    ``study.json``'s own ``updated``)."""
    from rlaccel_plugins.bench.report import machine

    out = Path(out)
    records = read_runs(out / RUNS_FILE)
    if not records:
        raise FileNotFoundError(f"no runs in {out / RUNS_FILE}")
    envs = {r.get("env_id") or _task_of(r["task"]).env_id for r in records if r.get("status") == "ok"}
    randoms = random_returns(out, envs)
    speed_path = out / "speed.json"
    speed = json.loads(speed_path.read_text())["tasks"] if speed_path.exists() else None
    if speed:  # a speed measure from before the variants were renamed (LEGACY_NAMES)
        speed = {task: {LEGACY_NAMES.get(v, v): d for v, d in variants.items()} for task, variants in speed.items()}
    stats = analyse(records, randoms, speed, reps)
    meta = json.loads((out / "study.json").read_text()) if (out / "study.json").exists() else {}
    # the machines the runs ran on, not the one writing the report (a study's runs may span several)
    ran_on = sorted({r.get("provenance", {}).get("machine") for r in records} - {None, ""})
    meta["machine"] = "; ".join(ran_on) or meta.get("machine") or machine()
    (out / "stats.json").write_text(json.dumps(stats, indent=2, default=str))
    text = markdown(stats, meta)
    (out / "report.md").write_text(text)
    if stats["decisions"]:  # the docs include these tables as they are
        (out / "decisions.md").write_text(decision_table(stats) + "\n")
    if stats.get("schedule_decisions"):
        (out / "schedule.md").write_text(schedule_table(stats) + "\n")
    if len(volume_rows(stats)) > 1:
        (out / "volume.md").write_text(volume_table(stats) + "\n")
    plots = plot(records, stats, out)
    print(text)
    print(f"written: {out / 'stats.json'}, {out / 'report.md'}" + "".join(f", {p}" for p in plots))
    return stats


if __name__ == "__main__":  # python -m rlaccel_plugins.bench.study_report DIR
    import sys

    write_report(sys.argv[1] if len(sys.argv) > 1 else "study-results")
