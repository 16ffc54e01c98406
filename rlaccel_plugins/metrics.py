"""Counters shared by the adapters: one dict of ``rlaccel/...`` values for any logger."""

from __future__ import annotations

import time
from typing import Any

PREFIX = "rlaccel/"


class FpsMeter:
    """Env steps per second between successive readings (the first reading counts from creation)."""

    def __init__(self, steps: int = 0) -> None:
        self._steps, self._time = steps, time.perf_counter()

    def read(self, steps: int) -> float:
        now = time.perf_counter()
        fps = (steps - self._steps) / max(now - self._time, 1e-9)
        self._steps, self._time = steps, now
        return fps


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
