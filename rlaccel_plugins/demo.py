"""`rlaccel demo`: what the drop-in does to SB3 DQN on CartPole-v1, the two measures side by side.

1. **Speed**: stock SB3 DQN (RL Zoo's settings) and the same model with the drop-in as a user gets it
   with no argument (``TieredReplayBuffer`` + ``AccelerateCallback``) learn the same env steps in this
   process, in alternating segments; the ratio is the median over segments, with a 95% CI.
2. **Learning**: both train ``seeds`` seeds each for a fixed budget in parallel workers; their
   evaluation curves are shown as IQM with 95% CI bands, and P(drop-in > stock) on the area under the
   curve says whether the runs can tell them apart.

It ends with one sentence saying what a user can expect and how sure it is, and names a busy host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STUDY_LINK = "the 20-seed learning study of this very task (docs: Learning study)"


def expectation(speed: tuple[float, float, float], poi: tuple[float, float, float], seeds: int) -> str:
    """The demo's sentence: what to expect from the two measures, and how sure they are.

    P(drop-in > stock) is computed on the area under the evaluation curve (learning over the whole budget);
    an interval holding 0.5 is undecided, and says so; so is a speed interval holding 1.0.

    Examples:
        >>> print(expectation((1.3, 1.2, 1.4), (0.55, 0.3, 0.8), 5))  # doctest: +NORMALIZE_WHITESPACE
        The drop-in ran the same learning work 1.30x as fast as stock [95% CI 1.20-1.40]. Learning: undecided
        with 5 seeds each (P(drop-in > stock) on the area under the evaluation curve = 0.55 [0.30, 0.80]: the
        interval holds 0.5, so these runs cannot tell whether the drop-in learns better or worse per env
        step); see the 20-seed learning study of this very task (docs: Learning study).
        >>> print(expectation((1.39, 0.96, 4.67), (0.7, 0.6, 0.8), 5).split(". Learning")[0])
        ... # doctest: +NORMALIZE_WHITESPACE
        The drop-in ran the same learning work 1.39x as fast as stock [95% CI 0.96-4.67]: the interval holds
        1.0, so this run cannot tell its speed from stock's (a busy or noisy host widens it; run the demo again
        on a quiet one)
    """
    ratio, low, high = speed
    faster = f"{ratio:.2f}x as fast as stock [95% CI {low:.2f}-{high:.2f}]"
    if low <= 1.0 <= high:
        faster += (": the interval holds 1.0, so this run cannot tell its speed from stock's (a busy or noisy host "
                   "widens it; run the demo again on a quiet one)")
    point, plow, phigh = poi
    shown = f"P(drop-in > stock) on the area under the evaluation curve = {point:.2f} [{plow:.2f}, {phigh:.2f}]"
    if plow > 0.5:
        learning = (f"better than stock's with {seeds} seeds each ({shown}), so expect it to reach a given return "
                    "sooner than the speed ratio alone says")
    elif phigh < 0.5:
        learning = (f"worse than stock's with {seeds} seeds each ({shown}), so it may need more env steps than "
                    "stock: check on your task before you rely on it")
    else:
        learning = (f"undecided with {seeds} seeds each ({shown}: the interval holds 0.5, so these runs cannot tell "
                    f"whether the drop-in learns better or worse per env step); see {STUDY_LINK}")
    return f"The drop-in ran the same learning work {faster}. Learning: {learning}."


AREA_VS_REACHED = ("P(X > Y) and the IQM area score the whole curve; *reached 475* counts runs with one evaluation at "
                   "475 or more, so the two can disagree: a run that peaks early and collapses reached 475 and still "
                   "scores a low area.")

# which update each measure ran: the default compiles a learn() call's gradient steps only where the call plans
# enough of them (compiled_updates: auto), which the speed measure's short segments do not
WHICH_UPDATE = ("Which update ran: the speed measure's segments are short `learn()` calls, which run the drop-in's "
                "eager fused update; the learning runs are long ones, which compile their gradient steps "
                "(`compiled_updates: auto`; compiled once on this machine, loaded after): per env step they learn "
                "as the eager update does, in less time.")


def run_demo(seeds: int = 5, steps: int = 30_000, out: str = "demo-results", workers: int | None = None,
             segments: int = 6, segment_steps: int = 1_500, first_seed: int = 0) -> dict[str, Any]:
    """Run the demo; prints both measures and the sentence, writes ``results.md``, ``results.json`` and
    ``iqm-sb3-dqn-cartpole-v1.png`` to ``out``."""
    from rlaccel_plugins.bench.host import HostMeter, verdict
    from rlaccel_plugins.bench.runner import raw_env_steps_per_s
    from rlaccel_plugins.bench.speed import measure_task
    from rlaccel_plugins.bench.study import NO_ARGUMENT, RUNS_FILE, STOCK, TASKS, run_study
    from rlaccel_plugins.bench.study_report import analyse, plot, random_returns

    task = TASKS["cartpole-dqn-demo"]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RUNS_FILE).unlink(missing_ok=True)  # the demo starts over every time
    raw_env_steps_per_s(task.env_id, seconds=0.5)  # a first, cold probe reads slow: not counted
    meter = HostMeter()
    meter.probe(raw_env_steps_per_s(task.env_id, seconds=1.0)["env_steps_per_s"])
    print(f"1/2 speed: stock SB3 DQN and the drop-in learn {segments} x {segment_steps:,} env steps each, "
          "interleaved in this process", flush=True)
    speed = measure_task(task, segments, segment_steps, seed=first_seed, variants=[NO_ARGUMENT],
                         report=lambda line: print(f"    {line}", flush=True))
    ratio = speed[NO_ARGUMENT]["vs_stock"]
    print(f"    the drop-in: {ratio[0]:.2f}x stock's env steps/s [95% CI {ratio[1]:.2f}-{ratio[2]:.2f}]", flush=True)
    print(f"2/2 learning: {seeds} seeds x 2 variants, {steps:,} env steps each, in parallel workers", flush=True)
    records = run_study("learning-quick", seeds=seeds, workers=workers, out=out_dir, first_seed=first_seed,
                        only=["cartpole-dqn-demo"], variants=[STOCK, NO_ARGUMENT], steps=steps)
    meter.probe(raw_env_steps_per_s(task.env_id, seconds=1.0)["env_steps_per_s"])
    stats = analyse(records, random_returns(out_dir, {task.env_id}), {task.key: speed}, reps=2_000)
    poi = stats["tasks"][task.key]["pairs"][f"{NO_ARGUMENT} > {STOCK}"]["poi"]
    sentence = expectation(ratio, poi, seeds)
    host, unsteady = verdict(meter.finish(), probes="before the speed measure and after the learning runs")
    rows = stats["tasks"][task.key]["rows"]
    table = [("| variant | env steps/s (speed measure) | IQM area (0 = random, 1 = 475) | IQM final | runs that "
              "reached 475 at an evaluation |"), "|---|---:|---:|---:|---:|"]
    for name in (STOCK, NO_ARGUMENT):
        row = rows[name]
        table.append(f"| {name} | {speed[name]['env_steps_per_s']:,.0f} | {row['iqm_auc'][0]:.2f} "
                     f"[{row['iqm_auc'][1]:.2f}, {row['iqm_auc'][2]:.2f}] | {row['iqm_final'][0]:.2f} "
                     f"[{row['iqm_final'][1]:.2f}, {row['iqm_final'][2]:.2f}] | {row['reached']}/{row['runs']} |")
    text = "\n".join(["# rlaccel demo: SB3 DQN on CartPole-v1 (RL Zoo's settings), stock vs the drop-in", "",
                      *table, "", sentence, "", AREA_VS_REACHED, "", WHICH_UPDATE, "", host, ""])
    (out_dir / "results.md").write_text(text)
    (out_dir / "results.json").write_text(json.dumps({"speed": speed, "stats": stats, "sentence": sentence,
                                                      "host": host, "unsteady_host": unsteady}, indent=2, default=str))
    plot(records, {"tasks": {task.key: stats["tasks"][task.key]}}, out_dir)
    print("\n" + text)
    print(f"written to {out_dir}: " + ", ".join(sorted(p.name for p in out_dir.iterdir() if p.is_file())))
    return {"speed": speed, "stats": stats, "sentence": sentence, "unsteady_host": unsteady}
