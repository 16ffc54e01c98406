"""A live progress line for training: env steps, fps, recent reward, full/dense updates, ETA.

Uses rich on a terminal, a plain line every ``log_interval`` seconds otherwise (a log file, a pipe, CI: rich
would show nothing there until the end). A broken terminal (closed, killed progress bar) disables the
display; it never stops training.
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
        >>> import sys
        >>> sys.stderr = sys.stdout  # a pipe or a log file, as doctest's output is: a plain line
        >>> with TrainingProgress(total=100, label="demo", interval=0, log_interval=0) as p:
        ...     p.update(50, reward=10.0)  # doctest: +ELLIPSIS
        demo: 50/100 steps | ... fps | reward 10.0
        demo: 50/100 steps | ... fps | reward 10.0
        >>> sys.stderr = sys.__stderr__
    """

    def __init__(self, total: int, label: str = "", enabled: bool = True, interval: float = 0.5,
                 log_interval: float = 10.0) -> None:
        self.total, self.label, self.enabled, self.interval = total, label, enabled, interval
        self.log_interval = log_interval
        self.steps = 0
        self.fields: dict[str, Any] = {}
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._rich: Any = None  # a rich Progress while one is shown
        self._task: Any = None

    def __enter__(self) -> TrainingProgress:  # noqa: PYI034 - typing.Self needs Python 3.11
        if not (self.enabled and sys.stderr.isatty()):
            self.interval = max(self.interval, self.log_interval)  # plain lines, not one every half second
        else:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

                # steps and ETA first: a narrow (80-column) terminal cuts the line's end, which holds the details
                self._rich = Progress(TextColumn("{task.description}"),
                                      TextColumn("{task.completed:>9,.0f}/{task.total:,.0f} steps"),
                                      TimeRemainingColumn(), BarColumn(bar_width=16), TextColumn("{task.fields[info]}"),
                                      console=Console(stderr=True), transient=False)
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
        if not self.enabled:
            return
        try:  # the final state, on a terminal and in a log alike
            self._draw(time.perf_counter())
            if self._rich is not None:
                self._rich.stop()
        except Exception:  # noqa: BLE001, S110 - the run is over; a broken display must not fail it
            pass
