"""`SparseDenseSchedule`: which optimizer steps are full and which are dense."""

from __future__ import annotations

from rlaccel_plugins.config import checked_int


class SparseDenseSchedule:
    """Step ``t`` (0-based, per optimizer) is a **full** update if ``t % interval == 0``, else **dense**.

    Examples:
        >>> s = SparseDenseSchedule(sparse_update_interval=3)
        >>> [s.is_full(t) for t in range(7)]
        [True, False, False, True, False, False, True]
    """

    def __init__(self, sparse_update_interval: int = 100) -> None:
        self.interval = int(checked_int("sparse_update_interval", sparse_update_interval, minimum=1))

    def is_full(self, step: int) -> bool:
        return step % self.interval == 0
