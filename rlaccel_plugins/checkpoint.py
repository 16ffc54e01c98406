"""Crash-safe checkpoints: a directory per checkpoint, written aside and renamed into place.

A checkpoint is ``<root>/step_<N>/`` holding the adapter's files plus ``manifest.json`` (the env-step
count and a SHA-256 per file). It is written as ``<root>/.tmp-step_<N>-<pid>/`` — each file fsynced,
the manifest last — and then renamed, which POSIX makes atomic: a reader sees a whole checkpoint or
none. :meth:`CheckpointStore.latest` returns the newest checkpoint whose files match their
checksums, and says why it skipped any other.

Examples:
    >>> import tempfile, pathlib
    >>> store = CheckpointStore(tempfile.mkdtemp(), keep=2)
    >>> for step in (100, 200, 300):
    ...     _ = store.save(step, {"state.txt": lambda path: pathlib.Path(path).write_text(str(step))})
    >>> [c.step for c in store.valid()]
    [300, 200]
    >>> store.latest().path.joinpath("state.txt").read_text()
    '300'
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlaccel_plugins.cadence import EnvStepCadence
from rlaccel_plugins.errors import ConfigError

log = logging.getLogger("rlaccel")
MANIFEST = "manifest.json"
PREFIX = "step_"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoints of one run under ``root``; keeps the newest ``keep``."""

    def __init__(self, root: str | os.PathLike, keep: int = 3) -> None:
        self.root = Path(root)
        self.keep = keep

    def save(self, step: int, writers: dict[str, Callable[[Path], None]], meta: dict | None = None) -> Checkpoint:
        """Write one checkpoint: ``writers`` maps a file name to a function writing that file."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{PREFIX}{step:012d}"
        tmp = self.root / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = {}
        for name, write in writers.items():
            write(tmp / name)
            _fsync(tmp / name)
            files[name] = _sha256(tmp / name)
        manifest = tmp / MANIFEST
        manifest.write_text(json.dumps({"step": step, "files": files, "meta": meta or {}}, indent=1))
        _fsync(manifest)
        _fsync(tmp)
        if final.exists():  # the same step saved again (e.g. a signal right after a periodic save)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(self.root)
        self._prune()
        return Checkpoint(final, step)

    def _candidates(self) -> list[Checkpoint]:
        if not self.root.is_dir():
            return []
        out = []
        for path in self.root.iterdir():
            if path.is_dir() and path.name.startswith(PREFIX) and path.name[len(PREFIX):].isdigit():
                out.append(Checkpoint(path, int(path.name[len(PREFIX):])))
        return sorted(out, key=lambda c: c.step, reverse=True)

    def problem(self, checkpoint: Checkpoint) -> str | None:
        """Why ``checkpoint`` cannot be used, or None if every file matches its checksum."""
        try:
            manifest = json.loads((checkpoint.path / MANIFEST).read_text())
            files = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"no readable {MANIFEST} ({type(exc).__name__})"
        for name, digest in files.items():
            path = checkpoint.path / name
            if not path.is_file():
                return f"{name} is missing"
            if _sha256(path) != digest:
                return f"{name} does not match its checksum"
        return None

    def valid(self) -> list[Checkpoint]:
        """Usable checkpoints, newest first (damaged ones are logged and skipped)."""
        out = []
        for checkpoint in self._candidates():
            reason = self.problem(checkpoint)
            if reason is None:
                out.append(checkpoint)
            else:
                log.warning("rlaccel: skipping checkpoint %s: %s", checkpoint.path, reason)
        return out

    def latest(self) -> Checkpoint | None:
        """The newest usable checkpoint, or None when there is none."""
        return next(iter(self.valid()), None)

    def has_any(self) -> bool:
        """Whether any checkpoint (usable or not) was ever written here."""
        return bool(self._candidates())

    def require_latest(self) -> Checkpoint:
        """:meth:`latest`, or a ConfigError that says what was found."""
        checkpoint = self.latest()
        if checkpoint is None:
            found = [c.path.name for c in self._candidates()]
            detail = f"only damaged ones: {found}" if found else "none at all"
            raise ConfigError(f"--resume needs a checkpoint under {self.root}, found {detail}. "
                              "Fix: point --resume at the --logdir of an `rlaccel train` run (it checkpoints every "
                              "checkpoint.every_seconds, every checkpoint.every_steps, and on SIGTERM/SIGINT).")
        return checkpoint

    def _prune(self) -> None:
        for old in self._candidates()[self.keep:]:
            shutil.rmtree(old.path, ignore_errors=True)
        for tmp in self.root.glob(".tmp-*"):
            if not tmp.name.endswith(f"-{os.getpid()}"):  # a writer that died mid-way
                shutil.rmtree(tmp, ignore_errors=True)


class CheckpointSchedule:
    """When a training loop should checkpoint: every ``every`` env steps and every ``every_seconds`` of
    wall time since the last checkpoint (0 turns either off), and at once when ``stop`` (a
    :class:`StopSignal`, or None) has received a signal — after which the loop stops.

    Examples:
        >>> schedule = CheckpointSchedule(every=100)
        >>> schedule.start(env_steps=250)
        >>> [schedule.due(s) for s in (260, 300, 350, 400)]
        [None, 'periodic', None, 'periodic']
    """

    def __init__(self, every: int, stop: StopSignal | None = None, every_seconds: float = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.stop, self.every_seconds, self.clock = every, stop, every_seconds, clock
        self._cadence = EnvStepCadence(0)
        self._last = clock()

    def start(self, env_steps: int) -> None:
        """Begin (or resume) at ``env_steps``: the next periodic checkpoint is the next multiple of
        ``every``, the next timed one ``every_seconds`` from now."""
        self._cadence = EnvStepCadence(self.every)
        self._cadence.start(env_steps)
        self._last = self.clock()

    def due(self, env_steps: int) -> str | None:
        """``"signal"``, ``"periodic"``, ``"timed"`` or None; an answer restarts the timer."""
        if self.stop is not None and self.stop.received is not None:
            return "signal"
        if self._cadence.due(env_steps):
            reason = "periodic"
        elif self.every_seconds and self.clock() - self._last >= self.every_seconds:
            reason = "timed"
        else:
            return None
        self._last = self.clock()
        return reason


def schedule_for(spec) -> CheckpointSchedule:
    """The checkpoint schedule of a ``TrainSpec``: its ``checkpoint`` config and its stop signal."""
    checkpoint = spec.config.checkpoint
    return CheckpointSchedule(checkpoint.every_steps, spec.stop, checkpoint.every_seconds)


def store_for(spec) -> CheckpointStore:
    """The checkpoint store of a ``TrainSpec`` with a logdir: ``<logdir>/checkpoints``, keeping ``keep``."""
    return CheckpointStore(Path(spec.logdir) / "checkpoints", keep=spec.config.checkpoint.keep)


def note_resume(logdir: str | os.PathLike, checkpoint: Checkpoint, env_steps: int, buffer) -> None:
    """Write ``<logdir>/resumed.json``: which checkpoint a run resumed from, and its buffer's digest."""
    (Path(logdir) / "resumed.json").write_text(json.dumps({
        "checkpoint": str(checkpoint.path), "env_steps": env_steps, "buffer_sha256": buffer_digest(buffer)}))


def buffer_digest(buffer) -> str:
    """SHA-256 of a replay buffer's pickled state (equal digests: bit-identical contents)."""
    import pickle

    return hashlib.sha256(pickle.dumps(buffer, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest()


def rng_state() -> dict:
    """The global RNG states a resumed run needs: torch, numpy and Python's ``random``."""
    import random

    import numpy as np
    import torch

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the training loop polls, so it can checkpoint and stop cleanly.

    A second signal of the same kind falls through to the previous handler (a double Ctrl-C still kills).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignal:  # noqa: PYI034 - typing.Self needs Python 3.11
        for sig in self.SIGNALS if self.enabled else ():
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.received == signum:
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
