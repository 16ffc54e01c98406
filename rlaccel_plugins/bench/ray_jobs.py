"""The learning study's runs as Ray tasks: one CPU and one fresh worker process each, on any cluster.

Each run ends as it does in a local worker process
(:func:`~rlaccel_plugins.bench.processes.run_with_provenance`, which records the commit, versions and
machine of the process that ran it), so the study writes the same records, and a study can grow on a
laptop, then on a cluster, in the same ``runs.jsonl``. Every machine of the cluster needs rlaccel and the
frameworks installed (the same versions: each run records them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any


def run_jobs_on_ray(jobs: list, address: str, on_end: Callable[[Any, str, Any, float], None],
                    target: Callable, may_start: Callable[[], bool] = lambda: True) -> None:
    """Run every job (``task``, ``variant``, ``seed``) as a Ray task (one CPU; ``max_calls=1``: each run in a
    process of its own; Ray's own retries off: the study retries; the caller's ``RLACCEL_*`` variables set)
    on the cluster at ``address`` (``local``: start one here), as many at a time as the cluster has CPUs;
    ``on_end(job, status, payload, seconds)`` as each run ends, a task whose worker died included (``failed``,
    with why). Once ``may_start()`` says no, no more jobs are submitted; the running ones end and are reported."""
    from rlaccel_plugins.bench.processes import run_with_provenance
    from rlaccel_plugins.parallel.ray_actors import connect

    ray = connect(None if address == "local" else address)
    # rlaccel's own settings (RLACCEL_PRESET, RLACCEL_CONFIG, ...) travel with each run, as they reach a local
    # worker process; the rest of this machine's environment stays here
    settings = {k: v for k, v in os.environ.items() if k.startswith("RLACCEL_")}
    remote = ray.remote(num_cpus=1, max_retries=0, max_calls=1,
                        runtime_env={"env_vars": settings} if settings else None)(run_with_provenance)
    queue, pending = list(jobs), {}  # type: ignore[var-annotated]

    def submit() -> None:  # the cluster's CPUs as they are now (one that grows gets more runs at a time)
        while queue and len(pending) < max(1, int(ray.cluster_resources().get("CPU", 1))) and may_start():
            job = queue.pop(0)
            pending[remote.remote(target, job.task, job.variant, job.seed)] = (job, time.perf_counter())

    submit()
    while pending:
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        job, started = pending.pop(ref)
        try:
            status, payload = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a worker that died (killed, out of memory) fails its run only
            status, payload = "failed", f"the Ray worker died: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        on_end(job, status, payload, time.perf_counter() - started)
        submit()
