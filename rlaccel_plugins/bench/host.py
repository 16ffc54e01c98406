"""Was the host steady while a suite ran? What ``rlaccel bench`` writes next to its table.

Variants are interleaved per seed, so a slow spell hits them alike; but a spell inside one variant's run,
another process on the same cores, or a hypervisor taking CPU time (steal) moves that variant alone,
and absolute rates from a slow day are not comparable with another day's. :class:`HostMeter` keeps:

- the raw env rate (random actions, no learning) measured before every seed and once more at the end:
  its spread is how much the machine's speed moved during the run;
- from ``/proc/stat`` (Linux), the share of CPU time the hypervisor stole, and how many cores' worth of
  CPU time processes other than the suite's own used on average (a test run on the same machine shows
  up here).

:func:`verdict` turns those into a line for the results, with a warning where the run was not steady.

Examples:
    >>> cpu_times("cpu  100 0 50 800 10 0 0 40 0 0")
    {'busy': 150, 'steal': 40, 'total': 1000}
    >>> verdict({"probe_rates": [1000.0, 990.0], "steal_share": 0.0, "others_cores": 0.01})[1]
    False
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

# Beyond these the run's rates are flagged
MAX_PROBE_SPREAD = 0.15
MAX_STEAL_SHARE = 0.05
MAX_OTHERS_CORES = 0.25

_PROC_STAT = Path("/proc/stat")


def cpu_times(stat_text: str) -> dict[str, int]:
    """The aggregate ``cpu`` line of ``/proc/stat`` as busy (user, nice, system, irq, softirq), steal and
    total clock ticks."""
    fields = [int(x) for x in stat_text.splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return {"busy": busy, "steal": steal, "total": busy + idle + iowait + steal}


def _read_stat() -> dict[str, int] | None:
    return cpu_times(_PROC_STAT.read_text()) if _PROC_STAT.exists() else None


def _own_cpu_seconds() -> float:
    """CPU seconds of this process, of its reaped children (spawned runs) and of the forkserver the runs
    are forked from with what it has reaped (its runs are its children, not this process's)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _forkserver_cpu_seconds()


def _forkserver_cpu_seconds() -> float:
    """The forkserver's own and its reaped children's CPU seconds (``/proc/<pid>/stat``); 0 where there
    is none running, or no ``/proc``."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])  # fields 14-17 of proc(5)
    return (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


class HostMeter:
    """Start it before a suite; :meth:`probe` records a raw env rate; :meth:`finish` gives the summary."""

    def __init__(self) -> None:
        self.probe_rates: list[float] = []
        self._stat = _read_stat()
        self._own, self._wall = _own_cpu_seconds(), time.perf_counter()

    def probe(self, rate: float) -> None:
        self.probe_rates.append(rate)

    def finish(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"probe_rates": self.probe_rates, "steal_share": None, "others_cores": None}
        now = _read_stat()
        if self._stat is None or now is None:
            return summary
        ticks = os.sysconf("SC_CLK_TCK")
        total = max(now["total"] - self._stat["total"], 1)
        busy_seconds = (now["busy"] - self._stat["busy"]) / ticks
        wall = max(time.perf_counter() - self._wall, 1e-9)
        summary["steal_share"] = (now["steal"] - self._stat["steal"]) / total
        summary["others_cores"] = max(busy_seconds - (_own_cpu_seconds() - self._own), 0.0) / wall
        return summary


def verdict(host: dict[str, Any], probes: str = "before each seed and at the end") -> tuple[str, bool]:
    """A line describing how steady the host was (``probes``: when the raw env rate was probed), and whether
    that is beyond the flagged limits."""
    rates = host.get("probe_rates") or []
    spread = (max(rates) / min(rates) - 1) if len(rates) > 1 and min(rates) > 0 else None
    steal, others = host.get("steal_share"), host.get("others_cores")
    parts = []
    if rates:
        parts.append(f"raw env steps/s {probes}: "
                     + ", ".join(f"{r:,.0f}" for r in rates) + (f" (spread {spread:.0%})" if spread is not None else ""))
    if steal is not None:
        parts.append(f"CPU time stolen by the hypervisor: {steal:.1%}")
    if others is not None:
        parts.append(f"other processes: {others:.2f} cores on average")
    unsteady = ((spread or 0) > MAX_PROBE_SPREAD or (steal or 0) > MAX_STEAL_SHARE
                or (others or 0) > MAX_OTHERS_CORES)
    line = "Host: " + ("; ".join(parts) if parts else "not measured") + "."
    if unsteady:
        line += (" **The host was not steady during this run** (limits: spread "
                 f"{MAX_PROBE_SPREAD:.0%}, steal {MAX_STEAL_SHARE:.0%}, others {MAX_OTHERS_CORES} cores): compare "
                 "variants within a seed, and do not quote its absolute rates against another run's.")
    return line, unsteady
