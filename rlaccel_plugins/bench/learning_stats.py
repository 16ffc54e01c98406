"""The learning study's statistics, as the field computes them (Agarwal et al. 2021, through ``rliable``).

Per run, two scores on a task-normalised scale (0 = the random policy's return, 1 = the task's
threshold): the area under the evaluation curve over the budget (the mean of the normalised
evaluation returns, evaluations evenly spaced) and the final evaluation; and the env steps to the
threshold. Per variant: the interquartile mean (IQM) with a 95% stratified-bootstrap CI; between two
variants: the probability of improvement P(X > Y) with its CI; and how many seeds a decision would
take, from the CI width the runs gave.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

REPS = 5_000  # bootstrap resamples: the CI bounds move by < 0.01 beyond this on 10-30 runs


def normalised(returns: Sequence[float] | np.ndarray, random: float, threshold: float) -> np.ndarray:
    """Returns on the task's scale: 0 = the random policy, 1 = the threshold.

    Examples:
        >>> normalised([22.0, 475.0, 500.0], random=22.0, threshold=475.0).round(3).tolist()
        [0.0, 1.0, 1.055]
    """
    return (np.asarray(returns, dtype=np.float64) - random) / (threshold - random)


def time_area(seconds: Sequence[float] | np.ndarray, scores: Sequence[float] | np.ndarray, horizon: float) -> float:
    """The mean normalised return over the first ``horizon`` seconds of training: each evaluation's score holds
    from its time until the next one's, and 0 (the random policy) before the first. A variant that trains faster
    gets its later, better evaluations inside the horizon: the area over time is what a faster update buys.

    Examples:
        >>> time_area([10.0, 20.0, 30.0], [0.5, 1.0, 1.0], horizon=20.0)  # 0 for 10 s, then 0.5 for 10 s
        0.25
    """
    seconds, scores = np.asarray(seconds, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    starts = np.clip(seconds, 0.0, horizon)
    ends = np.append(starts[1:], horizon)
    return float(np.sum(scores * (ends - starts)) / horizon)


def run_scores(curve: Sequence[Mapping[str, Any]], random: float, threshold: float,
               budget: float | None = None, horizon: float | None = None) -> dict[str, float]:
    """One run's scores: ``auc`` (mean normalised evaluation return over the budget), ``early`` and ``late``
    (the same over the evaluations in the first and in the second half of ``budget``; default: the last
    evaluation's env steps), ``final`` (the last evaluation, normalised), ``steps_to_threshold`` (inf when
    never reached) and, given a ``horizon`` in training seconds, ``auc_time`` (:func:`time_area`; else NaN). A
    run with no evaluation, or a non-finite one, scores NaN: it is counted, never compared.

    Examples:
        >>> curve = [{"env_steps": s, "mean_reward": r} for s, r in [(1, 0.0), (2, 0.5), (3, 1.0), (4, 1.0)]]
        >>> scores = run_scores(curve, random=0.0, threshold=1.0)
        >>> scores["early"], scores["late"], scores["auc"], scores["final"]
        (0.25, 1.0, 0.625, 1.0)
    """
    if not curve:
        return {"auc": math.nan, "early": math.nan, "late": math.nan, "final": math.nan, "steps_to_threshold": math.nan,
                "auc_time": math.nan}
    steps = np.array([p["env_steps"] for p in curve], dtype=np.float64)
    returns = np.array([p["mean_reward"] for p in curve], dtype=np.float64)
    scores = normalised(returns, random, threshold)
    half = (budget if budget else steps[-1]) / 2
    early, late = scores[steps <= half], scores[steps > half]
    reached = [s for s, r in zip(steps, returns) if r >= threshold]
    timed = all("train_seconds" in p for p in curve)
    return {"auc": float(scores.mean()), "early": float(early.mean()) if early.size else math.nan,
            "late": float(late.mean()) if late.size else math.nan, "final": float(scores[-1]),
            "steps_to_threshold": float(reached[0]) if reached else math.inf,
            "auc_time": time_area([p["train_seconds"] for p in curve], scores, horizon)
            if horizon is not None and timed else math.nan}


def _rng(seed: int) -> np.random.RandomState:
    return np.random.RandomState(seed)


def _bootstrap(data, func, reps: int, seed: int):
    """``rliable.library.get_interval_estimates`` with a seeded stream, so the same runs give the same report.

    rliable's stratified bootstraps draw their resamples from NumPy's global generator (``np.random.choice``)
    whatever ``random_state`` says, so the global generator is seeded here and put back afterwards. (rliable
    also hands ``random_state`` to ``arch``, which warns that it prefers a Generator: silenced.)"""
    import warnings

    from rliable import library

    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "random_state is deprecated", FutureWarning)
            return library.get_interval_estimates(data, func, reps=reps, random_state=_rng(seed))
    finally:
        np.random.set_state(saved)


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean over all runs and tasks: rliable's ``aggregate_iqm`` (scipy's ``trim_mean``
    at 0.25) computed the way scipy computes it, bit for bit, without scipy's per-call argument handling
    (most of the bootstrap's time: it calls this once per resample).

    Examples:
        >>> iqm(np.array([[0.0], [1.0], [2.0], [100.0]]))
        1.5
    """
    flat = np.asarray(scores).ravel()
    cut = int(0.25 * flat.size)
    middle = np.partition(flat, (cut, flat.size - cut - 1))[cut:flat.size - cut]
    return float(np.mean(middle))


def improvement_probability(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """P(X > Y) averaged over tasks (ties count half): rliable's ``probability_of_improvement``, whose
    Mann-Whitney U is this count (integers and halves: exact in float64, so bit for bit), without scipy's
    per-call argument handling. ``(runs, tasks)`` arrays.

    Examples:
        >>> improvement_probability(np.array([[1.0], [3.0]]), np.array([[2.0], [3.0]]))
        0.375
    """
    per_task = []
    for x, y in zip(scores_x.T, scores_y.T):
        if np.array_equal(x, y):
            per_task.append(0.5)
        elif np.isnan(x).any() or np.isnan(y).any():
            per_task.append(np.nan)
        else:
            wins = np.count_nonzero(x[:, None] > y[None, :]) + 0.5 * np.count_nonzero(x[:, None] == y[None, :])
            per_task.append(wins / (len(x) * len(y)))
    return float(np.mean(per_task))


def iqm_with_ci(scores: Mapping[str, np.ndarray], reps: int = REPS, seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """``{variant: (IQM, low, high)}`` over runs x tasks arrays (``(runs, tasks)``; a 1-D array is one task),
    with 95% stratified-bootstrap CIs.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> out = iqm_with_ci({"a": rng.normal(1.0, 0.1, 20)}, reps=500)
        >>> low, high = out["a"][1:]
        >>> bool(low < 1.0 < high)
        True
    """
    data = {k: _as_matrix(v) for k, v in scores.items()}
    points, intervals = _bootstrap(data, lambda x: np.array([iqm(x)]), reps, seed)
    return {k: (float(points[k][0]), float(intervals[k][0][0]), float(intervals[k][1][0])) for k in data}


def probability_of_improvement(x: np.ndarray, y: np.ndarray, reps: int = REPS,
                               seed: int = 0) -> tuple[float, float, float]:
    """``(P(X > Y), low, high)``: the chance that a run of X scores above a run of Y (ties count half),
    averaged over tasks, with its 95% stratified-bootstrap CI. ``x`` and ``y``: ``(runs, tasks)`` arrays.

    Examples:
        >>> rng = np.random.default_rng(1)
        >>> same = probability_of_improvement(rng.normal(0, 1, 40), rng.normal(0, 1, 40), reps=500)
        >>> bool(same[1] < 0.5 < same[2])
        True
    """
    pair = {"x,y": (_as_matrix(x), _as_matrix(y))}
    points, intervals = _bootstrap(pair, improvement_probability, reps, seed)
    low, high = np.ravel(intervals["x,y"])
    return float(np.ravel(points["x,y"])[0]), float(low), float(high)


def seeds_for_decision(runs: int, low: float, high: float, point: float, effect: float = 0.1) -> dict[str, float]:
    """How many runs per variant a decision would need, from the CI width ``runs`` runs gave (the width
    shrinks as 1/sqrt(runs)): ``observed`` to tell the observed P(X > Y) from 0.5 (inf when it is 0.5),
    ``effect`` to tell a P(X > Y) of 0.5 +- ``effect`` from 0.5.

    Examples:
        >>> seeds_for_decision(10, 0.25, 0.75, 0.5)["effect"]   # half-width 0.25 at 10 runs: 0.1 needs 63
        63.0
    """
    half = (high - low) / 2
    distance = abs(point - 0.5)

    def needed(margin: float) -> float:
        return math.inf if margin <= 0 else float(math.ceil(runs * (half / margin) ** 2))

    return {"observed": needed(distance), "effect": needed(effect)}


def steps_to_threshold_ci(steps: np.ndarray, reps: int = REPS, seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)`` env steps to the threshold over runs (inf where a run never reached it),
    with a 95% percentile-bootstrap CI of the median."""
    steps = np.asarray(steps, dtype=np.float64)
    rng = np.random.default_rng(seed)
    medians = np.sort(np.median(rng.choice(steps, size=(reps, len(steps)), replace=True), axis=1))
    # order statistics, not np.percentile: the medians may be inf (runs that never reached it)
    return float(np.median(steps)), float(medians[int(0.025 * (reps - 1))]), float(medians[int(0.975 * (reps - 1))])


def iqm_curves(curves: Mapping[str, np.ndarray], reps: int = 2_000, seed: int = 0):
    """IQM sample-efficiency curves: ``{variant: (runs, points)}`` normalised returns to
    ``({variant: IQM per point}, {variant: (2, points) CI})``."""
    def per_point(x: np.ndarray) -> np.ndarray:  # x: (runs, tasks=1, points)
        return np.array([iqm(x[..., i]) for i in range(x.shape[-1])])

    data = {k: np.asarray(v, dtype=np.float64)[:, None, :] for k, v in curves.items()}
    return _bootstrap(data, per_point, reps, seed)


def _as_matrix(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values[:, None] if values.ndim == 1 else values
