"""Counters shared by the adapters: one dict of ``rlaccel/...`` values for any logger."""

from __future__ import annotations

import time
from typing import Any

PREFIX = "rlaccel/"


class FpsMeter:
    """Env steps per second between successive readings (the first reading counts from creation).

    A reading at the step count of the previous one (e.g. at the end of training, right after the last
    rollout's) has no new steps to measure: it gives the previous rate again (None before any), and the
    window goes on from the previous reading, so a rate is never an artefact of when it was read.

    Examples:
        >>> meter = FpsMeter()
        >>> meter.read(0) is None
        True
        >>> rate = meter.read(100)
        >>> meter.read(100) == rate
        True
    """

    def __init__(self, steps: int = 0) -> None:
        self._steps, self._time = steps, time.perf_counter()
        self._last: float | None = None

    def read(self, steps: int) -> float | None:
        if steps == self._steps:
            return self._last
        now = time.perf_counter()
        self._last = (steps - self._steps) / max(now - self._time, 1e-9)
        self._steps, self._time = steps, now
        return self._last


def collect_metrics(updater: Any = None, replay: Any = None, fps: float | None = None,
                    guard: Any = None) -> dict[str, float]:
    """``rlaccel/full_updates``, ``rlaccel/dense_updates``, ``rlaccel/backward_flops_saved``,
    ``rlaccel/level_fill/L<i>``, ``rlaccel/level_samples/L<i>``, ``rlaccel/fps`` and the gradient
    guard's ``rlaccel/skipped_steps`` / ``rlaccel/clipped_steps`` — whatever applies.

    Examples:
        >>> collect_metrics(fps=123.0)
        {'rlaccel/fps': 123.0}
    """
    out: dict[str, float] = {}
    if updater is not None:
        stats = updater.stats
        out[PREFIX + "full_updates"] = stats["full_updates"]
        out[PREFIX + "dense_updates"] = stats["dense_updates"]
        if "backward_flops_saved" in stats:
            out[PREFIX + "backward_flops_saved"] = stats["backward_flops_saved"]
    if replay is not None:
        out.update({PREFIX + k: v for k, v in replay.stats().items()})
    if fps is not None:
        out[PREFIX + "fps"] = fps
    if guard is not None:
        out[PREFIX + "skipped_steps"] = guard.stats["skipped_steps"]
        out[PREFIX + "clipped_steps"] = guard.stats["clipped_steps"]
        if "loss_scale" in guard.stats:
            out[PREFIX + "loss_scale"] = guard.stats["loss_scale"]
    return out
