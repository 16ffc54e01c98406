"""Interleaved timing, shared by the maintained benchmarks (`benchmarks/`).

Every variant is timed once per round, the rounds one after another, so a slow phase of the host (another
process, a frequency change) hits every variant of that round alike; a ratio is taken within a round, and
the median over rounds is reported, with the range of the per-round ratios beside it.

Example:
    >>> from rlaccel_plugins.bench.timing import interleaved, median_ratio
    >>> times = interleaved({"a": lambda: 2.0, "b": lambda: 1.0}, rounds=3)
    >>> times["a"], median_ratio(times, "b", "a")
    ([2.0, 2.0, 2.0], 0.5)
    >>> calls = []
    >>> _ = interleaved({"a": lambda: calls.append("a") or 0.0, "b": lambda: calls.append("b") or 0.0},
    ...                 rounds=2, alternate=True)
    >>> calls
    ['a', 'b', 'b', 'a']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np


def interleaved(variants: Mapping[str, Callable[[], float]], rounds: int,
                alternate: bool = False) -> dict[str, list[float]]:
    """``rounds`` rounds, each calling every variant once in the mapping's order (reversed every other round
    with ``alternate``, so no variant always runs first, after the others have warmed the caches); each call
    returns its own measure (seconds, µs per step ...). Returns the measures per variant, in round order."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for r in range(rounds):
        for name, measure in order[::-1] if alternate and r % 2 else order:
            times[name].append(measure())
    return times


def seconds(run: Callable[[], object], repeat: int = 1) -> float:
    """Wall-clock seconds of ``repeat`` calls of ``run``."""
    start = time.perf_counter()
    for _ in range(repeat):
        run()
    return time.perf_counter() - start


def medians(times: Mapping[str, list[float]]) -> dict[str, float]:
    """The median of each variant's measures."""
    return {name: float(np.median(values)) for name, values in times.items()}


def round_ratios(times: Mapping[str, list[float]], variant: str, baseline: str) -> np.ndarray:
    """``variant / baseline`` within each round."""
    return np.asarray(times[variant]) / np.asarray(times[baseline])


def median_ratio(times: Mapping[str, list[float]], variant: str, baseline: str) -> float:
    """The median over rounds of ``variant / baseline`` within a round."""
    return float(np.median(round_ratios(times, variant, baseline)))
