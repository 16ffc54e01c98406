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
    CER,
    COMPILED,
    ERE,
    NO_ARGUMENT,
    RUNS_FILE,
    STOCK,
    TASKS,
    TIERS,
    UNIFORM,
    read_runs,
    study_commands,
)

RANDOM_FILE = "random_returns.json"
MIN_RUNS = 5  # below this a bootstrap CI's width says little about how many runs a decision needs
# the comparisons that matter: every drop-in against stock; every non-uniform scheme against uniform
PAIRS = [(v, STOCK) for v in (UNIFORM, TIERS, NO_ARGUMENT, ERE, CER, ANNEAL)] + \
        [(v, UNIFORM) for v in (TIERS, NO_ARGUMENT, ERE, CER, ANNEAL, COMPILED)]


def random_return(env_id: str, episodes: int = 100, seed: int = 0) -> float:
    """Mean return of uniformly random actions over ``episodes`` (the normalised score's 0)."""
    import gymnasium as gym

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


def _random_returns(out: Path, env_ids: set[str]) -> dict[str, float]:
    path = out / RANDOM_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    for env_id in sorted(env_ids - known.keys()):
        known[env_id] = random_return(env_id)
    path.write_text(json.dumps(known, indent=2))
    return known


def _task_of(key: str):
    return next((t for t in TASKS.values() if t.key == key), None)


def analyse(records: list[dict[str, Any]], randoms: dict[str, float], speed: dict[str, Any] | None = None,
            reps: int = ls.REPS) -> dict[str, Any]:
    """Scores, IQMs, probabilities of improvement and decisions from the study's ok records."""
    by_task: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for record in records:
        by_task.setdefault(record["task"], {}).setdefault(record["variant"], []).append(record)
    tasks_out: dict[str, Any] = {}
    auc_of: dict[str, dict[str, dict[int, float]]] = {}
    for key, variants in by_task.items():
        task = _task_of(key)
        order = [v.name for v in task.variants] if task else []
        variants = dict(sorted(variants.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
        env_id = next(iter(variants.values()))[0].get("env_id") or (task.env_id if task else key.split()[-1])
        threshold = task.threshold if task else next(iter(variants.values()))[0]["threshold"]
        random = randoms[env_id]
        scores = {v: [ls.run_scores(r["curve"], random, threshold) for r in sorted(runs, key=lambda r: r["seed"])]
                  for v, runs in variants.items()}
        auc_of[key] = {v: {r["seed"]: s["auc"] for r, s in zip(sorted(runs, key=lambda r: r["seed"]), scores[v])}
                       for v, runs in variants.items()}
        auc = {v: np.array([s["auc"] for s in ss]) for v, ss in scores.items()}
        final = {v: np.array([s["final"] for s in ss]) for v, ss in scores.items()}
        iqm_auc, iqm_final = ls.iqm_with_ci(auc, reps), ls.iqm_with_ci(final, reps)
        rows = {}
        for v, ss in scores.items():
            steps = np.array([s["steps_to_threshold"] for s in ss])
            rows[v] = {"runs": len(ss), "iqm_auc": iqm_auc[v], "iqm_final": iqm_final[v],
                       "reached": int(np.isfinite(steps).sum()),
                       "steps_to_threshold": ls.steps_to_threshold_ci(steps, reps)}
        pairs = {}
        for x, y in PAIRS:
            if x in auc and y in auc:
                point, low, high = ls.probability_of_improvement(auc[x], auc[y], reps)
                pairs[f"{x} > {y}"] = {"poi": (point, low, high), "runs": (len(auc[x]), len(auc[y])),
                                        "seeds_needed": ls.seeds_for_decision(min(len(auc[x]), len(auc[y])),
                                                                              low, high, point)}
        tasks_out[key] = {"env_id": env_id, "threshold": threshold, "random": random, "rows": rows, "pairs": pairs,
                          "budget": max(r.get("budget", r.get("cap", 0)) for rs in variants.values() for r in rs)}
        if speed and key in speed:
            _derive_time(tasks_out[key], speed[key])
    return {"tasks": tasks_out, "aggregate": _aggregate(auc_of, reps), "decisions": _decisions(auc_of, reps)}


def _common_matrix(auc_of: dict[str, dict[str, dict[int, float]]], keys: list[str], variant: str,
                   seeds: list[int]) -> np.ndarray:
    return np.array([[auc_of[k][variant][s] for k in keys] for s in seeds])


def _shared_seeds(auc_of, keys: list[str], variants: list[str]) -> list[int]:
    """The seeds every listed variant ran on every listed task (stratified bootstrap needs a matrix)."""
    sets = [set(auc_of[k].get(v, {})) for k in keys for v in variants]
    return sorted(set.intersection(*sets)) if sets else []


def _aggregate(auc_of, reps: int) -> dict[str, Any]:
    """Across tasks: IQM of the area score and P(X > Y) for each pair, over the seeds all tasks share."""
    keys = sorted(auc_of)
    variants = sorted({v for k in keys for v in auc_of[k]})
    every = [v for v in variants if all(v in auc_of[k] for k in keys)]
    seeds = _shared_seeds(auc_of, keys, every)
    if len(keys) < 2 or len(seeds) < 3:
        return {}
    matrices = {v: _common_matrix(auc_of, keys, v, seeds) for v in every}
    pairs = {f"{x} > {y}": ls.probability_of_improvement(matrices[x], matrices[y], reps)
             for x, y in PAIRS if x in matrices and y in matrices}
    return {"tasks": keys, "seeds": len(seeds), "iqm_auc": ls.iqm_with_ci(matrices, reps), "pairs": pairs}


def _decisions(auc_of, reps: int) -> dict[str, Any]:
    """For each preset family (the tasks whose tiers come from one preset) and for the no-argument default:
    keep non-uniform sampling only where P(it > uniform) over those tasks together has a CI above 0.5."""
    families: dict[str, list[str]] = {}
    for key in auc_of:
        task = _task_of(key)
        tiers = next((v for v in task.variants if v.name == TIERS), None) if task else None
        if tiers is not None:
            families.setdefault(tiers.preset, []).append(key)
    out = {}
    for name, keys, variant in [*((p, ks, TIERS) for p, ks in sorted(families.items())),
                                ("no argument (default)", sorted(auc_of), NO_ARGUMENT)]:
        keys = [k for k in keys if variant in auc_of[k] and UNIFORM in auc_of[k]]
        seeds = _shared_seeds(auc_of, keys, [variant, UNIFORM])
        if not keys or len(seeds) < 3:
            continue
        point, low, high = ls.probability_of_improvement(_common_matrix(auc_of, keys, variant, seeds),
                                                         _common_matrix(auc_of, keys, UNIFORM, seeds), reps)
        out[name] = {"tasks": keys, "seeds": len(seeds), "poi_vs_uniform": (point, low, high),
                     "keep_tiers": low > 0.5}
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
def _ci(value: tuple[float, float, float], digits: int = 2) -> str:
    point, low, high = value
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _steps(value: tuple[float, float, float]) -> str:
    def show(x: float) -> str:
        return f"{x / 1000:.1f}k" if math.isfinite(x) else "not reached"

    return f"{show(value[0])} [{show(value[1])}, {show(value[2])}]"


EXPLAINED = (
    "Scores are normalised per task (0 = a random policy's mean return, 1 = the task's threshold). "
    "*Area* is the mean normalised evaluation return over the budget (10 deterministic episodes per "
    "evaluation, evenly spaced); *final* is the last evaluation. IQM = interquartile mean over runs, "
    "with a 95% stratified-bootstrap CI (rliable). P(X > Y) is the probability that a run of X has a "
    "higher area score than a run of Y, with its 95% CI: an interval containing 0.5 means the runs "
    "cannot tell the two apart. The drop-in variants learn through the drop-in itself (fused updates, "
    "lean collection: the framework's computation, bit for bit), stock through the framework's own code.")


def _count(n: float) -> str:
    return "—" if not math.isfinite(n) else f"{n:,.0f}"


def summary_table(stats: dict[str, Any]) -> str:
    """One row per task and variant: the area score's IQM, P(X > stock), P(X > uniform) and the speed ratio,
    each with its 95% CI (the README's table)."""
    lines = ["| task | variant | runs | IQM area | P(X > stock) | P(X > uniform) | speed vs stock |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for key, task in stats["tasks"].items():
        for variant, row in task["rows"].items():
            poi = {baseline: _ci(task["pairs"][f"{variant} > {baseline}"]["poi"])
                   if f"{variant} > {baseline}" in task["pairs"] else "—" for baseline in (STOCK, UNIFORM)}
            speed = row.get("speed", {}).get("vs_stock")
            lines.append(f"| {key} | {variant} | {row['runs']} | {_ci(row['iqm_auc'])} | {poi[STOCK]} | {poi[UNIFORM]} | "
                         + (f"{_ci(speed)}x |" if speed else "1 |" if variant == STOCK and "speed" in row else "— |"))
    return "\n".join(lines)


def markdown(stats: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"# Learning study: {meta.get('study', '')}", "",
             (f"Commands, in order: {'; '.join(f'`{c}`' for c in study_commands(meta))}; updated "
              f"{meta.get('updated', '')}; machine: {meta.get('machine', '')}."),
             "",
             EXPLAINED, "", "## Summary", "", summary_table(stats), ""]
    for key, task in stats["tasks"].items():
        timed = any("speed" in r for r in task["rows"].values())
        lines += [f"## {key}", "",
                  (f"Budget {task['budget']:,} env steps; threshold {task['threshold']:g}; random policy "
                   f"{task['random']:.1f}."), "",
                  ("| variant | runs | IQM area | IQM final | reached | env steps to threshold (median) |"
                   + (" speed vs stock | derived time vs stock |" if timed else "")),
                  "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if timed else "")]
        for variant, row in task["rows"].items():
            line = (f"| {variant} | {row['runs']} | {_ci(row['iqm_auc'])} | {_ci(row['iqm_final'])} | "
                    f"{row['reached']}/{row['runs']} | {_steps(row['steps_to_threshold'])} |")
            if "speed" in row:
                ratio = row["speed"].get("vs_stock")
                line += (f" {_ci(ratio)}x |" if ratio else " — |") + (
                    f" {row['derived_time_vs_stock']:.2f}x |" if "derived_time_vs_stock" in row else " — |")
            elif timed:
                line += " — | — |"
            lines.append(line)
        lines += ["", ("| P(X > Y), area score | runs | 95% CI width | runs per variant to decide: observed effect / "
                       "P = 0.6 |"), "|---|---:|---:|---:|"]
        for pair, value in task["pairs"].items():
            _, low, high = value["poi"]
            need = value["seeds_needed"]
            needed = f"{_count(need['observed'])} / {_count(need['effect'])}" if min(value["runs"]) >= MIN_RUNS \
                else "too few runs to say"
            lines.append(f"| {pair}: {_ci(value['poi'])} | {value['runs'][0]} | {high - low:.2f} | {needed} |")
        lines.append("")
    aggregate = stats.get("aggregate") or {}
    if aggregate:
        lines += [f"## All tasks together ({aggregate['seeds']} seeds each: {', '.join(aggregate['tasks'])})", "",
                  "| variant | IQM area |", "|---|---:|"]
        lines += [f"| {v} | {_ci(value)} |" for v, value in aggregate["iqm_auc"].items()]
        lines += ["", "| P(X > Y), area score |", "|---|"]
        lines += [f"| {pair}: {_ci(value)} |" for pair, value in aggregate["pairs"].items()]
        lines.append("")
    if stats.get("decisions"):
        lines += ["## What the defaults follow", "",
                  ("A preset keeps non-uniform sampling only where P(tiers > uniform) over its tasks together has a "
                   "95% CI lower bound above 0.5."), "",
                  "| preset | tasks | seeds | P(tiers > uniform) | keeps tiers? |", "|---|---|---:|---:|---|"]
        for name, d in stats["decisions"].items():
            lines.append(f"| {name} | {', '.join(d['tasks'])} | {d['seeds']} | {_ci(d['poi_vs_uniform'])} | "
                         f"{'yes' if d['keep_tiers'] else 'no: uniform'} |")
        lines.append("")
    return "\n".join(lines)


def plot(records: list[dict[str, Any]], stats: dict[str, Any], out: Path) -> list[Path]:
    """IQM sample-efficiency curves with 95% CI bands (one panel per task) and the P(X > Y) chart."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    keys = list(stats["tasks"])
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        task = stats["tasks"][key]
        curves: dict[str, list] = {}
        steps: list[int] = []
        for record in records:
            if record["task"] != key:
                continue
            points = record["curve"]
            steps = [p["env_steps"] for p in points] if len(points) > len(steps) else steps
            curves.setdefault(record["variant"], []).append(
                ls.normalised([p["mean_reward"] for p in points], task["random"], task["threshold"]))
        length = min(len(c) for cs in curves.values() for c in cs)
        matrices = {v: np.array([c[:length] for c in cs]) for v, cs in curves.items()}
        points, intervals = ls.iqm_curves(matrices)
        x = np.array(steps[:length]) / 1000
        for variant in matrices:
            ax.plot(x, points[variant], label=variant)
            ax.fill_between(x, intervals[variant][0], intervals[variant][1], alpha=0.2)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{key} ({len(next(iter(matrices.values())))}+ runs each)", fontsize=10)
        ax.set_xlabel("env steps (thousands)")
        ax.set_ylabel("IQM normalised return (1 = threshold)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "iqm_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    pairs = [(key, pair, value["poi"]) for key, task in stats["tasks"].items() for pair, value in task["pairs"].items()]
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
        fig.tight_layout()
        path = out / "probability_of_improvement.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_report(out: str | Path, reps: int = ls.REPS) -> dict[str, Any]:
    """Read ``out/runs.jsonl`` (and ``speed.json``), write ``stats.json``, ``report.md`` and the plots."""
    from rlaccel_plugins.bench.report import machine

    out = Path(out)
    records = [r for r in read_runs(out / RUNS_FILE) if r.get("status") == "ok"]
    if not records:
        raise FileNotFoundError(f"no finished runs in {out / RUNS_FILE}")
    randoms = _random_returns(out, {r.get("env_id") or _task_of(r["task"]).env_id for r in records})
    speed_path = out / "speed.json"
    speed = json.loads(speed_path.read_text())["tasks"] if speed_path.exists() else None
    stats = analyse(records, randoms, speed, reps)
    meta = json.loads((out / "study.json").read_text()) if (out / "study.json").exists() else {}
    meta.setdefault("machine", machine())
    (out / "stats.json").write_text(json.dumps(stats, indent=2, default=str))
    text = markdown(stats, meta)
    (out / "report.md").write_text(text)
    plots = plot(records, stats, out)
    print(text)
    print(f"written: {out / 'stats.json'}, {out / 'report.md'}" + "".join(f", {p}" for p in plots))
    return stats


if __name__ == "__main__":  # python -m rlaccel_plugins.bench.study_report DIR
    import sys

    write_report(sys.argv[1] if len(sys.argv) > 1 else "study-results")
