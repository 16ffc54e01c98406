"""Fresh processes for the runs of `rlaccel bench`, `rlaccel demo` and the learning study.

Each run gets a process of its own, so its torch state, random states and peak memory are its own. A
spawned process imports torch and the frameworks again (seconds: longer than a short run; the measurement
is in the docs' lab notebook, "Measurements behind constants in the code"); where the platform has it, runs
are instead forked from multiprocessing's *forkserver*, a process that has imported them once and run
nothing else (no torch op, no thread pool), so a run starts in milliseconds. The run's environment
variables are the caller's at the time of the call, as with spawn (a variable that a library reads only at
import, such as ``OMP_NUM_THREADS``, is the one the forkserver started with). Peak RSS then counts the
pages the run touches (shared library pages included once touched), not the whole import a spawned process
pays.

Example:
    >>> from rlaccel_plugins.bench.processes import process_context
    >>> process_context().get_start_method() in ("forkserver", "spawn")
    True
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

# imported once by the forkserver; one that is not installed is skipped (multiprocessing ignores ImportError)
PRELOAD = ("numpy", "torch", "gymnasium", "stable_baselines3", "tianshou", "rlaccel_plugins.training",
           "rlaccel_sb3", "rlaccel_tianshou")


def process_context() -> ForkServerContext | SpawnContext:
    """The multiprocessing context runs start in: forkserver with the frameworks preloaded, else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def one_threaded(target: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """How a run ends in a worker process of its own: ``("ok", target(*args))`` with one torch thread, or
    ``("failed", why)`` — the caller records either and goes on with the other runs."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    try:
        return "ok", target(*args)
    except BaseException as exc:  # noqa: BLE001 - any way the run ends, it fails only itself
        return "failed", f"{type(exc).__name__}: {exc}"


def run_with_provenance(target: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """:func:`one_threaded`'s ``(status, payload)``, a finished run's record carrying the provenance of the process
    that ran it (commit, versions, machine: taken before the run), wherever it runs (a local worker, a Ray task
    on another machine)."""
    from rlaccel_plugins.bench.report import provenance

    origin = provenance()
    status, payload = one_threaded(target, *args)
    return (status, {**payload, "provenance": origin}) if status == "ok" else (status, payload)


def with_environment(environment: dict[str, str], target: Callable[..., Any], *args: Any) -> Any:
    """``target(*args)`` with ``os.environ`` set to ``environment`` first (a forked run's environment is
    the forkserver's, not its caller's)."""
    os.environ.clear()
    os.environ.update(environment)
    return target(*args)
