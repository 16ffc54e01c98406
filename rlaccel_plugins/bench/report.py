"""Summaries, the Markdown table and the plots of a bench run."""

from __future__ import annotations

import math
import platform
import statistics
import warnings
from pathlib import Path
from typing import Any

from rlaccel_plugins.bench.host import verdict

INF = math.inf


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, variant): medians over seeds; runs that miss the threshold count as +inf."""
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        rows.setdefault((record["task"], record["variant"]), []).append(record)
    out = []
    for (task, variant), runs in rows.items():
        ttt = [r["seconds_to_threshold"] if r["seconds_to_threshold"] is not None else INF for r in runs]
        out.append({
            "task": task, "variant": variant, "role": runs[0]["role"], "seeds": len(runs),
            "reached": sum(t != INF for t in ttt), "cap": max(r["cap"] for r in runs),
            "median_seconds_to_threshold": statistics.median(ttt),
            "median_steps_to_threshold": _median([r["steps_to_threshold"] or INF for r in runs]),
            "median_final_eval": _median([r["final_eval"] for r in runs]),
            "median_train_seconds": _median([r["train_seconds"] for r in runs]),
            "median_env_steps_per_s": _median([r["env_steps_per_s"] for r in runs]),
            "median_gradient_steps_per_s": _median([r["gradient_steps_per_s"] for r in runs]),
            "max_peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "replay_bytes_per_transition": _median([r["replay_bytes_per_transition"] for r in runs]),
        })
    for row in out:
        yard = next((y for y in out if y["task"] == row["task"] and y["role"] == "yardstick"), None)
        row["speedup_vs_yardstick"], row["speedup_bound"] = _speedup(yard, row)
    return out


def _speedup(yard: dict | None, row: dict) -> tuple[float | None, str]:
    """``(ratio, kind)``: kind is "exact", "lower bound" (the yardstick missed its cap) or "upper bound"."""
    if yard is None:
        return None, ""
    a, b = yard["median_seconds_to_threshold"], row["median_seconds_to_threshold"]
    if a == INF and b == INF:
        return None, "neither reached"
    if b == INF:  # the variant missed: it took longer than its training time
        return yard["median_seconds_to_threshold"] / row["median_train_seconds"], "upper bound"
    if a == INF:
        return yard["median_train_seconds"] / b, "lower bound"
    return a / b, "exact"


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    if value is None:
        return "—"
    return "not reached" if value == INF else format(value, spec)


def markdown(results: dict[str, Any]) -> str:
    """The results table (one per task) with the machine stated."""
    lines = [(f"Machine: {results['machine']}. Suite `{results['suite']}`, {results['seeds']} seed(s), "
              "variants interleaved per seed; medians over seeds; time = training wall time to a 10-episode "
              "deterministic evaluation mean >= threshold, evaluation excluded."), ""]
    if "host" in results:
        lines += [verdict(results["host"])[0], ""]
    for task in dict.fromkeys(r["task"] for r in results["summary"]):
        raw = results["raw_env_steps_per_s"].get(task, {})
        lines += [(f"**{task}** (threshold {results['thresholds'].get(task)}; raw env limit here: "
                   f"{_fmt(raw.get('env_steps_per_s'), ',.0f')} env steps/s with {raw.get('backend')})"), "",
                  ("| variant | reached | time to threshold (s) | env steps to threshold | final eval | env steps/s "
                   "| gradient steps/s | peak RSS (MB) | replay B/transition | speed-up vs yardstick |"),
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for row in (r for r in results["summary"] if r["task"] == task):
            ttt = row["median_seconds_to_threshold"]
            shown = f"not reached (> {row['cap']:,} steps)" if ttt == INF else _fmt(ttt)
            ratio, kind = row["speedup_vs_yardstick"], row["speedup_bound"]
            speed = "—" if ratio is None else ("1.00x (yardstick)" if row["role"] == "yardstick" else
                                               {"exact": "", "lower bound": "> ", "upper bound": "< "}[kind]
                                               + f"{ratio:.2f}x")
            lines.append(f"| {row['variant']} | {row['reached']}/{row['seeds']} | {shown} | "
                         f"{_fmt(row['median_steps_to_threshold'], ',.0f')} | {_fmt(row['median_final_eval'])} | "
                         f"{_fmt(row['median_env_steps_per_s'], ',.0f')} | "
                         f"{_fmt(row['median_gradient_steps_per_s'], ',.0f')} | {_fmt(row['max_peak_rss_mb'], ',.0f')} | "
                         f"{_fmt(row['replay_bytes_per_transition'], ',.0f')} | {speed} |")
        lines.append("")
    return "\n".join(lines)


def machine() -> str:
    from rlaccel_plugins.hardware import cpu_count, cpu_model, gpu_info

    _, gpu = gpu_info()
    model = cpu_model()
    cpu = f" ({model})" if model else ""
    return (f"{platform.machine()}{cpu} {cpu_count()} cores{', ' + gpu if gpu else ', no GPU'}, "
            f"{platform.platform(terse=True)}")


PROVENANCE_PACKAGES = ("rlaccel-plugins", "torch", "numpy", "gymnasium", "stable-baselines3", "sb3-contrib", "tianshou", "mujoco")


def _git(*args: str, root: Path | None = None) -> str | None:
    """``git *args`` in ``root`` (default: this checkout), its output, or None where there is no git or no checkout."""
    import subprocess

    root = root or Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict[str, Any]:
    """What produced a result: the commit (and whether the tree had uncommitted changes), the package
    versions that compute it, and the machine."""
    from importlib import metadata

    versions = {}
    for package in PROVENANCE_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "HEAD"), "uncommitted_changes": bool(status) if status is not None else None,
            "versions": versions, "machine": machine()}


def code_state(root: Path | None = None) -> str | None:
    """The Python code this checkout (or the one at ``root``) would run, in words that change when any tracked
    ``.py`` file does (committed, staged or not): a commit that only adds results leaves it as it is. None
    outside a git checkout.

    Example:
        >>> state = code_state()
        >>> state is None or state.startswith("python sources ")
        True
    """
    import hashlib

    tracked = _git("ls-files", "--stage", "--", "*.py", root=root)
    edits = _git("diff", "HEAD", "--", "*.py", root=root)
    if tracked is None or edits is None:
        return None
    digest = hashlib.sha1(f"{tracked}\n{edits}".encode()).hexdigest()[:10]
    return f"python sources {digest}" + (" (with uncommitted edits)" if edits else "")


def _step_curve(points: list[dict], key: str, grid) -> list[float]:
    """The last evaluation at or before each grid value (NaN before the first)."""
    out, i, last = [], 0, math.nan
    for x in grid:
        while i < len(points) and points[i][key] <= x:
            last = points[i]["mean_reward"]
            i += 1
        out.append(last)
    return out


def plot(records: list[dict[str, Any]], thresholds: dict[str, float], out_dir: Path) -> list[Path]:
    """Per task: reward vs training wall time and vs env steps, median line per variant, seeds shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    for task in dict.fromkeys(r["task"] for r in records):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        runs = [r for r in records if r["task"] == task and r["curve"]]
        for variant in dict.fromkeys(r["variant"] for r in runs):
            curves = [r["curve"] for r in runs if r["variant"] == variant]
            for ax, key in zip(axes, ("train_seconds", "env_steps")):
                grid = np.linspace(0, max(c[-1][key] for c in curves), 200)
                values = np.array([_step_curve(c, key, grid) for c in curves])
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN before a seed's first evaluation
                    line, = ax.plot(grid, np.nanmedian(values, axis=0), label=variant)
                    ax.fill_between(grid, np.nanmin(values, axis=0), np.nanmax(values, axis=0),
                                    color=line.get_color(), alpha=0.15)
        for ax, label in zip(axes, ("training wall time (s, evaluation excluded)", "env steps")):
            if thresholds.get(task) is not None:
                ax.axhline(thresholds[task], color="tab:red", linestyle="--", linewidth=1)
            ax.set_xlabel(label)
            ax.set_ylabel("evaluation mean reward")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{task}: median over seeds, min-max shaded")
        fig.tight_layout()
        path = out_dir / f"{task}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths

