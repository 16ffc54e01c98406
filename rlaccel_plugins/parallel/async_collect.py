"""Asynchronous collection: an actor thread steps the envs while the learner thread trains.

The actor runs ``step_fn()`` (env step + batched inference with its own copy of the policy) in a
loop and hands each result to the learner through a bounded queue (back-pressure: the actor waits
when the learner falls ``max_pending`` chunks behind). Only the learner touches the replay buffer,
so transitions are written without races; :meth:`stop` drains what is left, so none is lost.
torch and envpool release the GIL in their kernels, which is what lets the two threads overlap.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class AsyncCollector:
    """Background producer of env-step chunks.

    Examples:
        >>> import itertools
        >>> counter = itertools.count()
        >>> collector = AsyncCollector(lambda: next(counter), max_pending=4)
        >>> collector.start()
        >>> chunks = collector.drain(wait_for=3)
        >>> rest = collector.stop()
        >>> sorted(chunks + rest) == list(range(collector.produced))
        True
    """

    def __init__(self, step_fn: Callable[[], Any], max_pending: int = 16) -> None:
        self.step_fn = step_fn
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.produced = 0
        self.consumed = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rlaccel-actor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self.step_fn()
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.05)
                        self.produced += 1
                        break
                    except queue.Full:
                        continue
                else:  # stopped while the queue was full: keep the chunk for the final drain
                    self._leftover = item
                    self.produced += 1
        except BaseException as exc:  # noqa: BLE001 - anything, surfaced in the learner thread by drain()
            self.error = exc

    def drain(self, wait_for: int = 1, timeout: float = 30.0) -> list[Any]:
        """Chunks produced so far; blocks until at least ``wait_for`` are there (0: never blocks)."""
        items: list[Any] = []
        while len(items) < wait_for:
            if self.error is not None:
                raise RuntimeError("the rlaccel actor thread failed") from self.error
            try:
                items.append(self._queue.get(timeout=min(timeout, 0.5)))
            except queue.Empty:
                if self._thread is None or not self._thread.is_alive():
                    break
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self.consumed += len(items)
        return items

    def stop(self) -> list[Any]:
        """Stop the actor and return every chunk it produced that was not drained yet."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        rest = self.drain(wait_for=0)
        leftover = self.__dict__.pop("_leftover", None)
        if leftover is not None:
            rest.append(leftover)
            self.consumed += 1
        if self.error is not None:
            raise RuntimeError("the rlaccel actor thread failed") from self.error
        return rest
