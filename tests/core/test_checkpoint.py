"""Crash-safe checkpoints: atomic writes, damaged ones skipped, SIGTERM and SIGKILL during `rlaccel train`."""

import hashlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from rlaccel_plugins.checkpoint import CheckpointStore, state_digest
from rlaccel_plugins.errors import ConfigError


def _write(text):
    return lambda path: Path(path).write_text(text)


def test_damaged_or_partial_checkpoints_are_skipped_with_a_reason(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep=10)
    for step in (10, 20, 30, 40):
        store.save(step, {"a.txt": _write(f"a{step}"), "b.bin": _write("b" * step)})
    (tmp_path / "step_000000000040" / "b.bin").write_text("corrupted")          # bit rot
    (tmp_path / "step_000000000030" / "manifest.json").unlink()                # died before the manifest
    (tmp_path / ".tmp-step_000000000050-999").mkdir()                          # a writer killed mid-way
    with caplog.at_level("WARNING", logger="rlaccel"):
        assert store.latest().step == 20
    reasons = " ".join(r.message for r in caplog.records)
    assert "b.bin does not match its checksum" in reasons and "no readable manifest.json" in reasons
    store.save(60, {"a.txt": _write("a60")})
    assert not (tmp_path / ".tmp-step_000000000050-999").exists()


def test_keep_prunes_old_checkpoints_and_an_empty_dir_explains_itself(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(5):
        store.save(step, {"x": _write(str(step))})
    assert [c.step for c in store.valid()] == [4, 3]
    with pytest.raises(ConfigError, match="--resume needs a checkpoint under .* found none at all"):
        CheckpointStore(tmp_path / "empty").require_latest()


def _train(logdir, *extra, framework="sb3", steps=6000):
    cmd = [sys.executable, "-m", "rlaccel_plugins.cli", "train", "--no-progress"]
    if extra and extra[0] == "--resume":
        return subprocess.Popen(cmd + list(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    args = ["--framework", framework, "--steps", str(steps), "--eval-freq", "100000", "--logdir", str(logdir),
            "--set", "every_steps=500", "--set", "keep=100", *extra]
    return subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _resume_here(logdir):
    """`rlaccel train --resume` in the test's process: the run to completion needs no subprocess (and no
    second import of torch and the frameworks); the runs that get killed do."""
    from rlaccel_plugins.cli import main

    return main(["train", "--resume", str(logdir), "--no-progress"])


def _wait_for_training(process, logdir, timeout=60):
    """Until the run's TensorBoard file exists (SB3 has started learning)."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if list(Path(logdir).rglob("events.out.tfevents.*")):
            return
        time.sleep(0.05)


def _buffer_digest(checkpoint_path):
    with open(Path(checkpoint_path) / "replay.pkl", "rb") as f:
        return state_digest(pickle.load(f))


def _recorded(checkpoint_path):
    return json.loads((Path(checkpoint_path) / "manifest.json").read_text())["meta"]["digests"]


@pytest.mark.slow
@pytest.mark.needs('stable_baselines3', 'tianshou')
@pytest.mark.parametrize("framework", ["sb3", "tianshou"])
def test_sigterm_writes_a_checkpoint_before_exit_and_resume_finishes(framework, tmp_path, capsys):
    process = _train(tmp_path, framework=framework, steps=100_000)
    _wait_for_training(process, tmp_path)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert "continue with: rlaccel train --resume" in out
    latest = CheckpointStore(tmp_path / "checkpoints").latest()
    model = "model.zip" if framework == "sb3" else "algorithm.pt"
    assert latest is not None and (latest.path / "replay.pkl").exists() and (latest.path / model).exists()
    assert 0 < latest.step < 100_000
    spec = json.loads((tmp_path / "spec.json").read_text())
    spec["steps"] = latest.step + 1_000  # a short remainder, so the test stays short
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert _resume_here(tmp_path) == 0
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["env_steps"] == latest.step
    assert resumed["digests"] == _recorded(latest.path)  # the state rebuilt is the state saved
    assert resumed["digests"]["buffer"] == _buffer_digest(latest.path)
    finished = json.loads((tmp_path / "result.json").read_text())
    assert finished["env_steps"] >= latest.step + 1_000
    # a finished run says so, and keeps its model as it is
    saved = Path(finished["model_path"]).read_bytes()
    assert _resume_here(tmp_path) == 2
    assert "resume must name an unfinished run" in capsys.readouterr().err
    assert Path(finished["model_path"]).read_bytes() == saved


@pytest.mark.needs('stable_baselines3')
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_sigkill_at_random_moments_then_resume_finishes_with_bit_exact_buffers(tmp_path):
    rng = random.Random(0)
    store = CheckpointStore(tmp_path / "checkpoints", keep=100)
    resumed_from = []
    for attempt in range(3):  # a budget no kill can come after: every kill lands mid-run
        process = _train(tmp_path, steps=1_000_000) if store.latest() is None else \
            _train(tmp_path, "--resume", str(tmp_path))
        _wait_for_training(process, tmp_path)
        time.sleep(rng.uniform(0.2, 2.0))
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        for checkpoint in store._candidates():  # whatever the moment, no checkpoint is ever unreadable
            assert store.problem(checkpoint) is None, checkpoint
        if (tmp_path / "resumed.json").exists():
            resumed_from.append(json.loads((tmp_path / "resumed.json").read_text()))
            os.remove(tmp_path / "resumed.json")
    assert store.latest() is not None and not (tmp_path / "result.json").exists()
    spec = json.loads((tmp_path / "spec.json").read_text())
    spec["steps"] = store.latest().step + 1_000  # then a short remainder, so the test stays short
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert _resume_here(tmp_path) == 0
    assert json.loads((tmp_path / "result.json").read_text())["env_steps"] >= spec["steps"]
    resumed_from.append(json.loads((tmp_path / "resumed.json").read_text()))
    for resumed in resumed_from:  # the buffer each resumed run loaded is the checkpoint's, bit for bit
        assert resumed["digests"] == _recorded(resumed["checkpoint"])
        assert resumed["digests"]["buffer"] == _buffer_digest(resumed["checkpoint"])


@pytest.mark.needs("stable_baselines3")
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_resuming_past_a_damaged_checkpoint_verifies_and_reports_it_once(tmp_path, caplog):
    from rlaccel_plugins.cli import main

    args = ["train", "--steps", "1200", "--eval-freq", "600", "--no-progress", "--logdir", str(tmp_path),
            "--set", "every_steps=400"]
    assert main(args) == 0
    newest, older = CheckpointStore(tmp_path / "checkpoints").valid()[:2]
    (newest.path / "model.zip").write_bytes(b"bit rot")
    spec = json.loads((tmp_path / "spec.json").read_text())
    spec["steps"] = 1600
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    with caplog.at_level("WARNING", logger="rlaccel"):
        assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 0
    skips = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skips) == 1 and newest.path.name in skips[0]  # checked once, not once per reader
    assert json.loads((tmp_path / "resumed.json").read_text())["env_steps"] == older.step


def _short_run_with_two_checkpoints(tmp_path, framework):
    from rlaccel_plugins.cli import main

    args = ["train", "--framework", framework, "--steps", "2000", "--eval-freq", "2000", "--no-progress",
            "--logdir", str(tmp_path), "--set", "every_steps=400", "--set", "keep=10"]
    assert main(args) == 0
    spec = json.loads((tmp_path / "spec.json").read_text())
    spec["steps"] = 2400
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return CheckpointStore(tmp_path / "checkpoints").valid()[:2]


@pytest.mark.needs("stable_baselines3", "tianshou")
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
@pytest.mark.parametrize("framework", ["sb3", "tianshou"])
def test_a_checkpoint_whose_state_does_not_load_back_as_saved_falls_back_to_the_previous(framework, tmp_path, caplog):
    from rlaccel_plugins.cli import main

    newest, older = _short_run_with_two_checkpoints(tmp_path, framework)
    # an intact file (its checksum fixed up) that rebuilds other state than was saved: another step's buffer
    (newest.path / "replay.pkl").write_bytes((older.path / "replay.pkl").read_bytes())
    manifest = json.loads((newest.path / "manifest.json").read_text())
    manifest["files"]["replay.pkl"] = hashlib.sha256((newest.path / "replay.pkl").read_bytes()).hexdigest()
    (newest.path / "manifest.json").write_text(json.dumps(manifest))
    assert CheckpointStore(tmp_path / "checkpoints").problem(newest) is None
    with caplog.at_level("WARNING", logger="rlaccel"):
        assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 0
    skips = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skips) == 1 and newest.path.name in skips[0] and "buffer" in skips[0], skips
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["env_steps"] == older.step and resumed["digests"] == _recorded(older.path)


@pytest.mark.needs("stable_baselines3")
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_a_loader_that_rebuilds_the_buffer_wrongly_is_caught_on_resume(tmp_path, monkeypatch, capsys):
    from rlaccel_plugins.cli import main
    from rlaccel_plugins.replay.storage import RingStorage

    _short_run_with_two_checkpoints(tmp_path, "sb3")
    unpickle = RingStorage.__setstate__

    def off_by_one(self, state):  # a loader bug: one stored value comes back changed
        unpickle(self, state)
        next(iter(self.arrays.values()))[0] += 1

    monkeypatch.setattr(RingStorage, "__setstate__", off_by_one)
    assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 2
    assert "no checkpoint under" in capsys.readouterr().err and not (tmp_path / "resumed.json").exists()


@pytest.mark.slow
@pytest.mark.needs("stable_baselines3")
def test_a_sigkilled_run_resumes_from_its_last_timed_checkpoint(tmp_path):
    # checkpoints by wall time only (no every_steps), as every run with a logdir has by default
    cmd = [sys.executable, "-m", "rlaccel_plugins.cli", "train", "--no-progress", "--steps", "200000",
           "--eval-freq", "200000", "--logdir", str(tmp_path), "--set", "every_seconds=2"]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    store = CheckpointStore(tmp_path / "checkpoints")
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None and len(store.valid()) < 2:
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)  # no handler runs: only the timed checkpoints are there
    process.communicate(timeout=60)
    latest = store.latest()
    assert latest is not None and latest.step > 0
    spec = json.loads((tmp_path / "spec.json").read_text())
    spec["steps"] = latest.step + 500
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert _resume_here(tmp_path) == 0
    assert json.loads((tmp_path / "resumed.json").read_text())["env_steps"] == latest.step


@pytest.mark.needs("stable_baselines3")
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_a_run_killed_before_its_first_checkpoint_starts_over_on_resume(tmp_path, caplog):
    from rlaccel_plugins.cli import main

    (tmp_path / "spec.json").write_text(json.dumps({"framework": "sb3", "algo": "dqn", "env_id": "CartPole-v1",
                                                    "steps": 400, "eval_freq": 200, "config": {}}))
    with caplog.at_level("WARNING", logger="rlaccel"):
        assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 0
    assert "has no checkpoint yet" in caplog.text
    assert json.loads((tmp_path / "result.json").read_text())["env_steps"] >= 400


def test_checkpoint_state_loads_without_running_code_and_a_file_that_would_is_refused(tmp_path, monkeypatch):
    import random

    import numpy as np
    import torch

    from rlaccel_plugins.checkpoint import TRUST_VARIABLE, load_state, restore_rng, rng_state

    state = {"clock": {"seconds": 1.5}, "rng": rng_state(), "env_steps": 3}
    drawn = (np.random.rand(), random.random(), torch.rand(1).item())
    torch.save(state, tmp_path / "state.pt")
    restore_rng(load_state(tmp_path / "state.pt")["rng"])  # weights_only=True reads it
    assert (np.random.rand(), random.random(), torch.rand(1).item()) == drawn

    class Payload:  # what a crafted checkpoint would carry: an object whose unpickling runs code
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"evil": Payload()}, tmp_path / "crafted.pt")
    with pytest.raises(ConfigError, match=f"loading would run as code.*{TRUST_VARIABLE}=1"):
        load_state(tmp_path / "crafted.pt")
    monkeypatch.setenv(TRUST_VARIABLE, "1")
    assert load_state(tmp_path / "crafted.pt") == {"evil": None}  # the caller's explicit trust


def test_a_stop_signal_just_before_a_block_that_it_cuts_short_ends_the_block_as_it_starts():
    """A SIGTERM that lands between the loop's poll and the start of a compilation must not wait for it either."""
    from rlaccel_plugins.checkpoint import StoppedWaiting, StopSignal, stop_cuts_short

    entered = []
    with StopSignal() as stop:
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(StoppedWaiting), stop_cuts_short():
            entered.append(True)
    assert stop.received == signal.SIGTERM and not entered
    with stop_cuts_short():  # outside any StopSignal: nothing pending
        entered.append(True)
    assert entered == [True]


def _slow_to_compile(x):
    return torch.sin(x).cumsum(0) * 2.0


def test_a_stop_signal_during_a_compilation_ends_it_and_the_step_runs_eagerly(tmp_path, monkeypatch):
    """SIGTERM while the update step compiles (10-40 s on a cold cache): the compilation ends at once, this
    call runs the same function eagerly, the flag is set for the loop's poll and nothing is saved."""
    from rlaccel_plugins.checkpoint import StopSignal
    from rlaccel_plugins.fused.compiled_step import CompiledCall, compile_unsupported, persist_unsupported

    if compile_unsupported() or persist_unsupported():
        pytest.skip("this PyTorch compiles no persisted step")
    monkeypatch.setenv("RLACCEL_CACHE_DIR", str(tmp_path))
    x = torch.linspace(0, 1, 7)
    with StopSignal() as stop:
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
        call = CompiledCall(_slow_to_compile)
        timer.start()
        try:
            out = call(x)
        finally:
            timer.cancel()
            timer.join()
    assert stop.received == signal.SIGTERM
    assert call.failed == "a stop signal arrived while it compiled"
    assert torch.equal(out, _slow_to_compile(x))
    assert not list(tmp_path.glob("*.bin"))  # nothing half-compiled was kept
    assert torch.equal(call(x), _slow_to_compile(x))  # and it stays eager
