"""What a maintained benchmark leaves behind: one JSON file per run (``--out FOLDER`` writes
``FOLDER/<script>.json``), which ``python -m benchmarks.results_index`` reads; the table a script prints is for
the person watching it.

A file holds the command, the date, what produced it (commit, package versions, machine), the script's
``headline`` (the one figure the results page shows) and its ``rows`` (every measured value, by name)::

    from benchmarks import _results

    parser = argparse.ArgumentParser()
    _results.add_out_argument(parser)
    ...
    _results.write(args.out, "async_bench", headline="SB3 DQN CartPole, async: 0.55x sync's speed",
                   rows=[{"framework": "sb3", "sync_s": 1.9, "async_s": 3.4, "speed": 0.55}])
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, metavar="FOLDER",
                        help="write the results as a JSON file in FOLDER (default: print only)")


def command(script: str, argv: list[str] | None = None) -> str:
    """The command line that ran ``script`` (``python -m benchmarks.<script> ARGS``)."""
    return f"python -m benchmarks.{script} " + shlex.join(sys.argv[1:] if argv is None else argv)


def write(out: str | None, script: str, *, headline: str, rows: list[dict[str, Any]], name: str | None = None,
          argv: list[str] | None = None, **about: Any) -> Path | None:
    """Write ``out/<name>.json`` (``name``: the script's, or its own for a script measuring several tasks) whole
    or not at all (a temporary file renamed over it); nothing when ``out`` is None. ``about``: anything else
    worth keeping (the settings a run used, a measured ceiling)."""
    if out is None:
        return None
    from rlaccel_plugins.bench.report import provenance

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    document = {"command": command(script, argv), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                **provenance(), "headline": headline, "rows": rows, **about}
    text = json.dumps(document, indent=1) + "\n"  # a value JSON cannot hold fails here, before any file exists
    path = folder / f"{name or script}.json"
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as handle:
        handle.write(text)
    os.replace(handle.name, path)
    return path


def read(path: Path) -> dict[str, Any]:
    """A results file, checked to hold what the results index reads."""
    document = json.loads(path.read_text())
    missing = [key for key in ("command", "date", "machine", "headline", "rows") if key not in document]
    if missing:
        raise ValueError(f"{path}: a benchmark's results file needs {', '.join(missing)}")
    return document
