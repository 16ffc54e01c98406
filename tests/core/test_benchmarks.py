"""The maintained benchmark suite runs: each script at a tiny size, as a smoke test (seconds, not a
timing: nothing here is asserted about speed). ``gpu_bench.py`` needs CUDA (``benchmarks/gpu_check.sh``
runs it on a GPU machine) and ``ray_scaling.py`` starts a Ray cluster per run (half a minute), so
both are only checked to parse their arguments. The finished one-offs in ``benchmarks/investigations/``
are not maintained and not run.
Each runs in the test's own process as ``python -m benchmarks.<name>`` runs it
(``tests.script_helpers.run_module``), and writes the results file the results index reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import _results
from tests.script_helpers import run_module

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "buffer_memory.py": ["--transitions", "64"],
    "checkpoint_size.py": ["--steps", "64"],
    "collect_bench.py": ["--envs", "2", "--steps", "64", "--rounds", "1"],
    "dropin_learn.py": ["--steps", "512", "--segment", "256"],
    "fused_bench.py": ["--steps", "2", "--rounds", "1", "--algos", "dqn", "--no-ppo", "--frameworks", "sb3"],
    "grad_norm_bench.py": ["--rounds", "1", "--number", "2"],
    "replay_bench.py": ["--capacity-scale", "0.01", "--episode", "50", "--repeats", "2"],
    "sb3_overhead.py": ["--env-steps", "64", "--grad-steps", "4", "--rounds", "1", "--fill", "256"],
    "tianshou_overhead.py": ["--env-steps", "64", "--rounds", "1", "--atari-size", "256"],
    "update_overheads.py": ["--rounds", "1", "--number", "2"],
    "updates_bench.py": ["--batch-sizes", "32", "--steps", "2", "--rounds", "1"],
    "async_bench.py": ["--steps", "512", "--rounds", "1", "--frameworks", "sb3"],
    "peers.py": ["--tasks", "dqn-cartpole", "--steps", "256", "--warmup", "1100", "--rounds", "1",
                 "--variants", "stock,stock 1-thread,drop-in"],
    "peer_phases.py": ["--steps", "512", "--warmup", "1100", "--variants", "stock,drop-in"],
    "gpu_bench.py": ["--help"],
    "ray_scaling.py": ["--help"],
}


def test_every_maintained_benchmark_has_a_smoke_run():
    scripts = {p.name for p in (ROOT / "benchmarks").glob("[!_]*.py")} - {"results_index.py"}
    assert scripts == set(TINY), f"add the new benchmark to TINY (or move it to investigations/): {scripts ^ set(TINY)}"


@pytest.mark.parametrize("script", sorted(TINY))
def test_the_benchmark_runs_at_a_tiny_size(script, tmp_path, monkeypatch, capsys):
    args = TINY[script] + ([] if "--help" in TINY[script] else ["--out", str(tmp_path / "results")])
    out = run_module(f"benchmarks.{script[:-3]}", args, tmp_path, monkeypatch, capsys)
    assert out.strip(), "it printed nothing"
    if "--help" in args:
        return
    written = sorted((tmp_path / "results").glob("*.json"))
    assert written, "it wrote no results file"
    for path in written:  # each through benchmarks/_results.py, as the results index reads it
        document = _results.read(path)
        assert document["command"].startswith(f"python -m benchmarks.{script[:-3]} ")
        assert document["rows"] and re.search(r"\d", document["headline"]), document["headline"]


def test_a_results_file_is_written_whole_and_read_only_when_complete(tmp_path):
    path = _results.write(str(tmp_path), "async_bench", headline="x 1.00x", rows=[{"a": 1}], argv=["--steps", "8"])
    document = _results.read(path)
    assert document["command"] == "python -m benchmarks.async_bench --steps 8"
    assert document["rows"] == [{"a": 1}] and "commit" in document and "machine" in document
    assert [p.name for p in tmp_path.iterdir()] == ["async_bench.json"]  # no temporary file left
    assert _results.write(None, "async_bench", headline="x", rows=[]) is None
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"command": "c", "rows": []}))
    with pytest.raises(ValueError, match="date, machine, headline"):
        _results.read(broken)
