"""The study's speed measure: env steps and gradient steps per second of ``learn()`` on fixed work.

Every variant's model lives in this one process and learns in segments of the same number of env
steps, the variants taking turns (the order alternating every segment: A B C, C B A, ...), so the
host's drifts over minutes hit every variant alike. Each segment gives a ratio to stock's segment of
the same round; the reported ratio is the median over segments with a 95% percentile-bootstrap CI.
No evaluation runs. The first segment (the framework's warm-up: ``learning_starts`` random steps,
buffer allocation) is not counted.

A framework's training run takes part when it can train on in segments (a ``learn_more(steps)``
method: SB3's does; Tianshou's trainer loop does not, so its tasks are skipped with the reason).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlaccel_plugins.bench.study import STOCK, StudyTask, get_study


def _spec(task: StudyTask, variant, steps: int, seed: int):
    from rlaccel_plugins.bench.runner import variant_config
    from rlaccel_plugins.training import TrainSpec

    return TrainSpec(framework=variant.framework, algo=variant.algo, env_id=task.env_id, config=variant_config(variant),
                     steps=steps, seed=seed, stock=variant.stock, dropin=variant.dropin, progress=False,
                     hyperparams=dict(variant.hyperparams), stop_at=float("inf"))


def ratio_ci(ratios: list[float], reps: int = 5_000, seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)`` of per-segment ratios, with a 95% percentile-bootstrap CI of the median.

    Examples:
        >>> point, low, high = ratio_ci([1.2, 1.3, 1.25, 1.22, 1.28, 1.31])
        >>> round(point, 3), low <= point <= high
        (1.265, True)
    """
    values = np.asarray(ratios, dtype=np.float64)
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, size=(reps, len(values))), axis=1)
    return float(np.median(values)), float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def measure_task(task: StudyTask, segments: int = 8, segment_steps: int = 2_000, seed: int = 0,
                 variants: list[str] | None = None, report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Interleaved segments of every variant of ``task`` (or those named in ``variants``); ``report`` gets a
    line after each round of segments (the demo prints it: the measure runs for minutes)."""
    from rlaccel_plugins.plugins import get_plugin_manager
    from rlaccel_plugins.training import torch_threads

    chosen = [v for v in task.variants if variants is None or v.name in variants or v.name == STOCK]
    adapter = get_plugin_manager().adapters.get(task.framework)
    total = segment_steps * (segments + 1)
    runs = {}
    for variant in chosen:
        spec = _spec(task, variant, total, seed)
        with torch_threads(spec.config):
            run = adapter.load("train")(spec)
        if not hasattr(run, "learn_more"):
            return {"skipped": f"{task.framework}'s training run cannot learn in segments (no learn_more)"}
        runs[variant.name] = (run, spec)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    gradients: dict[str, list[int]] = {name: [] for name in runs}
    names = list(runs)
    for index in range(segments + 1):
        for name in names if index % 2 == 0 else names[::-1]:
            run, spec = runs[name]
            with torch_threads(spec.config):
                before = run.learn_more(0)[1]
                started = time.perf_counter()
                _, after = run.learn_more(segment_steps)
                elapsed = time.perf_counter() - started
            if index > 0:  # the first segment is the warm-up
                seconds[name].append(elapsed)
                gradients[name].append(after - before)
        if report is not None:
            rates = ", ".join(f"{name} {segment_steps / seconds[name][-1]:,.0f}" for name in names if seconds[name])
            report(f"round {index} of {segments}" + (f": env steps/s {rates}" if rates else " (warm-up, not timed)"))
    out = {}
    for name in names:
        per_segment = [segment_steps / s for s in seconds[name]]
        row: dict[str, Any] = {"env_steps_per_s": float(np.median(per_segment)),
               "gradient_steps_per_s": float(np.median([g / s for g, s in zip(gradients[name], seconds[name])])),
               "segments": len(per_segment), "segment_env_steps": segment_steps}
        if name != STOCK and STOCK in seconds:
            row["vs_stock"] = ratio_ci([s / v for s, v in zip(seconds[STOCK], seconds[name])])
        out[name] = row
    return out


def run_speed(name: str, out: str | Path, segments: int = 8, segment_steps: int = 2_000,
              only: list[str] | None = None, variants: list[str] | None = None) -> dict[str, Any]:
    """`rlaccel bench --suite speed`: the speed measure of study ``name``'s tasks, into ``out/speed.json``."""
    from rlaccel_plugins.bench.report import machine

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "speed.json"
    results = json.loads(path.read_text()) if path.exists() else {"tasks": {}}
    for task in get_study(name, only):
        if task.missing():
            print(f"skipping {task.key}: {task.missing()}", flush=True)
            continue
        print(f"{task.key}: {segments} segments of {segment_steps:,} env steps per variant, interleaved", flush=True)
        measured = measure_task(task, segments, segment_steps, variants=variants)
        if "skipped" in measured:
            print(f"  skipped: {measured['skipped']}", flush=True)
            continue
        results["tasks"][task.key] = measured
        for variant, row in measured.items():
            ratio = row.get("vs_stock")
            shown = f"; {ratio[0]:.2f}x stock's speed [{ratio[1]:.2f}, {ratio[2]:.2f}]" if ratio else ""
            print(f"  {variant}: {row['env_steps_per_s']:,.0f} env steps/s, {row['gradient_steps_per_s']:,.0f} "
                  f"gradient steps/s{shown}", flush=True)
    results.update(machine=machine(), date=time.strftime("%Y-%m-%d"),
                   command=f"rlaccel bench --suite speed --study {name} --segments {segments} "
                           f"--segment-steps {segment_steps} --out {out}")
    path.write_text(json.dumps(results, indent=2))
    return results
