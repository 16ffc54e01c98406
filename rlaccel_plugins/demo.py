"""`rlaccel demo`: stock SB3 DQN vs rlaccel on CartPole-v1, side by side, with a plot.

Runs alternate per seed (stock, rlaccel, stock, rlaccel, …) so machine noise hits both alike.
Time-to-threshold is training wall time with evaluations excluded (DESIGN.md §8).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from rlaccel_plugins.config import load_config
from rlaccel_plugins.training import THRESHOLDS, TrainResult, TrainSpec, run_training

ENV_ID = "CartPole-v1"


def run_demo(seeds: int = 1, preset: str = "classic_control", steps: int = 100_000, eval_freq: int = 2_000,
             out: str = "demo-results", progress: bool = True, first_seed: int = 0) -> dict:
    """Train both variants, print the comparison, write ``results.json`` and ``demo.png`` to ``out``."""
    threshold = THRESHOLDS[ENV_ID]
    config = load_config(preset=preset)
    results: dict[str, list[TrainResult]] = {"stock": [], "rlaccel": []}
    for seed in range(first_seed, first_seed + seeds):
        for variant in ("stock", "rlaccel"):
            spec = TrainSpec(framework="sb3", algo="dqn", env_id=ENV_ID, config=config, steps=steps, seed=seed,
                             stock=variant == "stock", eval_freq=eval_freq, progress=progress)
            results[variant].append(run_training(spec))
    summary = {}
    for variant, runs in results.items():
        ttts = [r.time_to_threshold(threshold) for r in runs]
        reached = [t for t in ttts if t[0] is not None]
        summary[variant] = {
            "seconds_to_threshold": [t[0] for t in ttts], "steps_to_threshold": [t[1] for t in ttts],
            "median_seconds": statistics.median([t[0] if t[0] is not None else float("inf") for t in ttts]),
            "reached": f"{len(reached)}/{len(runs)}", "final_eval": [r.final_eval for r in runs]}
    stock, accel = summary["stock"]["median_seconds"], summary["rlaccel"]["median_seconds"]
    ratio = stock / accel if accel not in (0, float("inf")) and stock != float("inf") else None
    print(f"\nCartPole-v1 DQN, time to a 10-episode evaluation mean >= {threshold:g} "
          f"(training wall time, evaluation excluded), {seeds} seed(s):")
    for variant in ("stock", "rlaccel"):
        s = summary[variant]
        shown = "not reached" if s["median_seconds"] == float("inf") else f"{s['median_seconds']:.1f} s"
        print(f"  {variant:<8} median {shown:>12}  reached {s['reached']}  steps {s['steps_to_threshold']}")
    print(f"  speed-up (stock / rlaccel): {ratio:.2f}x" if ratio else "  speed-up: n/a (a variant did not reach it)")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(
        {"summary": summary, "speedup": ratio, "preset": preset,
         "runs": {k: [asdict(r) for r in v] for k, v in results.items()}}, indent=2, default=str))
    _plot(results, threshold, out_dir / "demo.png")
    print(f"  results: {out_dir / 'results.json'}, plot: {out_dir / 'demo.png'}")
    return {"summary": summary, "speedup": ratio}


def _plot(results: dict[str, list[TrainResult]], threshold: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"stock": "tab:gray", "rlaccel": "tab:blue"}
    for variant, runs in results.items():
        for i, r in enumerate(runs):
            label = variant if i == 0 else None
            axes[0].plot([p.train_seconds for p in r.curve], [p.mean_reward for p in r.curve], color=colors[variant],
                         label=label, alpha=0.8)
            axes[1].plot([p.env_steps for p in r.curve], [p.mean_reward for p in r.curve], color=colors[variant],
                         label=label, alpha=0.8)
    for ax, xlabel in zip(axes, ("training wall time (s, evaluation excluded)", "env steps")):
        ax.axhline(threshold, color="tab:red", linestyle="--", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("evaluation mean reward (10 episodes)")
        ax.legend()
    fig.suptitle("CartPole-v1 DQN: stock SB3 (RL Zoo settings) vs rlaccel")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
