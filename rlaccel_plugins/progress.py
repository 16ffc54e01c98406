"""A live progress line for training: env steps, fps, recent reward, full/dense updates, ETA.

Uses rich when installed, a plain periodic line otherwise. A broken terminal (closed, killed
progress bar) disables the display; it never stops training.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class TrainingProgress:
    """Context manager that adapters update with :meth:`update`.

    Examples:
        >>> with TrainingProgress(total=100, label="demo", enabled=False) as p:
        ...     p.update(50, reward=10.0, full=1, dense=9)
        >>> p.steps
        50
    """

    def __init__(self, total: int, label: str = "", enabled: bool = True, interval: float = 0.5) -> None:
        self.total, self.label, self.enabled, self.interval = total, label, enabled, interval
        self.steps = 0
        self.fields: dict[str, Any] = {}
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._rich: Any = None  # a rich Progress while one is shown
        self._task: Any = None

    def __enter__(self) -> TrainingProgress:  # noqa: PYI034 - typing.Self needs Python 3.11
        if self.enabled:
            try:
                from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

                self._rich = Progress(TextColumn("{task.description}"), BarColumn(),
                                      TextColumn("{task.completed:>9,.0f}/{task.total:,.0f} steps"),
                                      TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
                self._rich.start()
                self._task = self._rich.add_task(self.label, total=self.total, info="")
            except Exception:  # noqa: BLE001 - rich missing or no usable terminal: plain lines
                self._rich = None
        return self

    def update(self, steps: int, **fields: Any) -> None:
        """Report progress: total env steps so far plus any fields (reward, full, dense, ...)."""
        self.steps = steps
        self.fields.update({k: v for k, v in fields.items() if v is not None})
        now = time.perf_counter()
        if not self.enabled or now - self._last_draw < self.interval:
            return
        self._last_draw = now
        try:
            self._draw(now)
        except Exception:  # noqa: BLE001 - a closed terminal or killed display must never break training
            self.enabled = False

    def _info(self, now: float) -> str:
        fps = self.steps / max(now - self._start, 1e-9)
        parts = [f"{fps:,.0f} fps"]
        if "actors" in self.fields:  # Ray scale-out: the actors' own rate and the policy lag
            parts.append(f"{self.fields['actors']} actors {self.fields.get('actor_fps', 0):,.0f} fps "
                         f"lag {self.fields.get('lag', 0):.0f}")
        if "reward" in self.fields:
            parts.append(f"reward {self.fields['reward']:.1f}")
        if "eval" in self.fields:
            parts.append(f"eval {self.fields['eval']:.1f}")
        if "full" in self.fields or "dense" in self.fields:
            parts.append(f"updates {self.fields.get('full', 0):,.0f} full / {self.fields.get('dense', 0):,.0f} dense")
        return " | ".join(parts)

    def _draw(self, now: float) -> None:
        if self._rich is not None:
            self._rich.update(self._task, completed=min(self.steps, self.total), info=self._info(now))
        else:
            print(f"{self.label}: {self.steps:,}/{self.total:,} steps | {self._info(now)}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            try:
                self._draw(time.perf_counter())
                self._rich.stop()
            except Exception:  # noqa: BLE001, S110 - the run is over; a broken display must not fail it
                pass
