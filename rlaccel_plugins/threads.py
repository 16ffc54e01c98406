"""torch's intra-op threads for a training process that shares its cores with others.

PyTorch's CPU build runs its parallel kernels on OpenMP threads that spin while they wait for each other at
the end of every kernel. An RL update is thousands of small kernels a second, so where another process
holds one of the cores, a thread waits on a thread that is not running, at every kernel: on a 2-core VM
beside one busy process, SB3 DQN's update took 3-4x its calm time, and up to 60x beside several (stock SB3
and the drop-in alike). One thread fewer than the busy cores leave free never waits on a descheduled peer.

:class:`ThreadPolicy` reads, every ``interval`` seconds, how many cores' worth of CPU time other processes
used (``/proc/stat`` less this process's own time, so an env subprocess counts as another process) and
sets ``torch.set_num_threads`` to the cores they leave, at least one and at most the count the process had
(``OMP_NUM_THREADS``, or the user's own ``torch.set_num_threads``); :meth:`ThreadPolicy.stop` puts that count
back. The thread count changes no result on RL-sized networks (an MLP's updates are bit for bit the same
on one thread and two: tested), so a seeded run stays the same run whatever the machine is doing.

Examples:
    >>> threads_for(cap=2, cores=2, others=0.1)   # calm: every thread
    2
    >>> threads_for(cap=2, cores=2, others=1.0)   # one busy process: one thread
    1
    >>> threads_for(cap=8, cores=16, others=3.4)  # never more than the process had
    8
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable

from rlaccel_plugins.hardware import cpu_count

_PROC_STAT = "/proc/stat"


def threads_for(cap: int, cores: int, others: float) -> int:
    """The intra-op threads for a process allowed ``cap`` of them, on ``cores`` cores of which other
    processes use ``others`` (a process using more than half a core takes it)."""
    return max(1, min(cap, cores - math.floor(others + 0.5)))


def busy_cpu_seconds() -> float | None:
    """CPU seconds all processes spent running since boot (``/proc/stat``), or None without ``/proc``."""
    try:
        with open(_PROC_STAT) as file:
            fields = [int(x) for x in file.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (fields + [0] * 7)[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds this process (all its threads) spent running."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ThreadPolicy:
    """torch's intra-op thread count kept to the cores other processes leave free, for the life of a
    training call (:meth:`start` … :meth:`update` as often as convenient … :meth:`stop`).

    Args:
        interval: seconds between two readings of the machine (one reading costs ~20 µs).
        cores: the cores this process may use (default: its affinity mask).
        fixed: a count to hold instead, whatever the machine does (``training.num_threads: N``).
        busy: what :func:`busy_cpu_seconds` returns (tests give their own).
    """

    def __init__(self, interval: float = 1.0, cores: int | None = None, fixed: int | None = None,
                 busy: Callable[[], float | None] = busy_cpu_seconds) -> None:
        self.interval, self.cores, self.fixed, self._busy = interval, cores or cpu_count(), fixed, busy
        self.threads: int | None = None  # the count set now, None outside start()..stop()
        self.others: float | None = None  # other processes' cores in the last interval
        self.changes = 0  # how often the count changed
        self._cap = self._previous = 1
        self._mark: tuple[float, float, float] | None = None

    def start(self) -> None:
        import torch

        self._cap = self._previous = torch.get_num_threads()
        self.threads, self.changes = self._previous, 0
        if self.fixed is not None:
            torch.set_num_threads(self.fixed)
            self.threads = self.fixed
            return
        self._mark = self._reading()

    def update(self) -> int | None:
        """Read the machine if ``interval`` has passed since the last reading, and set the thread count
        from it; the count in force."""
        if self._mark is None or time.perf_counter() - self._mark[0] < self.interval:
            return self.threads
        now = self._reading()
        if now is None:
            self._mark = None  # no /proc: nothing to read, the count stays
            return self.threads
        wall = now[0] - self._mark[0]
        self.others = max(0.0, (now[1] - self._mark[1]) - (now[2] - self._mark[2])) / wall
        self._mark = now
        threads = threads_for(self._cap, self.cores, self.others)
        if threads != self.threads:
            import torch

            torch.set_num_threads(threads)
            self.threads, self.changes = threads, self.changes + 1
        return self.threads

    def stop(self) -> None:
        """The thread count the process had before :meth:`start`."""
        if self.threads is not None:
            import torch

            torch.set_num_threads(self._previous)
        self.threads, self._mark = None, None

    def _reading(self) -> tuple[float, float, float] | None:
        busy = self._busy()
        return None if busy is None else (time.perf_counter(), busy, own_cpu_seconds())
