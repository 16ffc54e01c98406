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

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    def valid(self, below: int | None = None) -> list[Checkpoint]:
        """Usable checkpoints (of steps below ``below``, if given), newest first (damaged ones are logged
        and skipped)."""
        out = []
        for checkpoint in self._candidates():
            if below is not None and checkpoint.step >= below:
                continue
            reason = self.problem(checkpoint)
            if reason is None:
                out.append(checkpoint)
            else:
                log.warning("rlaccel: skipping checkpoint %s: %s", checkpoint.path, reason)
        return out

    def latest(self) -> Checkpoint | None:
        """The newest usable checkpoint, or None when there is none."""
        return next(iter(self.valid()), None)

    def meta(self, checkpoint: Checkpoint) -> dict:
        """The ``meta`` a checkpoint was saved with."""
        return json.loads((checkpoint.path / MANIFEST).read_text()).get("meta", {})

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


FIRST_TIMED_SECONDS = 30  # the first timed checkpoint: a run shorter than every_seconds can be resumed too


class CheckpointSchedule:
    """When a training loop should checkpoint: every ``every`` env steps and every ``every_seconds`` of
    wall time since the last checkpoint (0 turns either off; the first timed one comes after at most
    :data:`FIRST_TIMED_SECONDS`), and at once when ``stop`` (a :class:`StopSignal`, or None) has received a
    signal — after which the loop stops.

    Examples:
        >>> schedule = CheckpointSchedule(every=100)
        >>> schedule.start(env_steps=250)
        >>> [schedule.due(s) for s in (260, 300, 350, 400)]
        [None, 'periodic', None, 'periodic']
        >>> now = [0.0]
        >>> timed = CheckpointSchedule(every=0, every_seconds=300, clock=lambda: now[0])
        >>> timed.start(env_steps=0)
        >>> for now[0] in (29.0, 30.0, 300.0, 330.0):
        ...     print(now[0], timed.due(0))
        29.0 None
        30.0 timed
        300.0 None
        330.0 timed
    """

    def __init__(self, every: int, stop: StopSignal | None = None, every_seconds: float = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.stop, self.every_seconds, self.clock = every, stop, every_seconds, clock
        self._cadence = EnvStepCadence(0)
        self._last = clock()
        self._wait = min(every_seconds, FIRST_TIMED_SECONDS)

    def start(self, env_steps: int) -> None:
        """Begin (or resume) at ``env_steps``: the next periodic checkpoint is the next multiple of
        ``every``, the next timed one ``every_seconds`` from now."""
        self._cadence = EnvStepCadence(self.every)
        self._cadence.start(env_steps)
        self._last = self.clock()
        self._wait = min(self.every_seconds, FIRST_TIMED_SECONDS)

    @property
    def enabled(self) -> bool:
        """Whether it checkpoints at all (then a finished run also checkpoints at its end)."""
        return bool(self.every or self.every_seconds)

    def due_at_end(self, env_steps: int, last: Checkpoint | None) -> bool:
        """Whether a run finishing at ``env_steps`` takes a last checkpoint: checkpoints are on and the newest
        one (``last``, None: none yet) is not already at that step.

        Examples:
            >>> CheckpointSchedule(every=100).due_at_end(250, None), CheckpointSchedule(every=0).due_at_end(250, None)
            (True, False)
        """
        return self.enabled and (last is None or last.step != env_steps)

    def due(self, env_steps: int) -> str | None:
        """``"signal"``, ``"periodic"``, ``"timed"`` or None; an answer restarts the timer."""
        if self.stop is not None and self.stop.received is not None:
            return "signal"
        if self._cadence.due(env_steps):
            reason = "periodic"
        elif self.every_seconds and self.clock() - self._last >= self._wait:
            reason = "timed"
        else:
            return None
        self._last, self._wait = self.clock(), self.every_seconds
        return reason


def schedule_for(spec) -> CheckpointSchedule:
    """The checkpoint schedule of a ``TrainSpec``: its ``checkpoint`` config and its stop signal."""
    checkpoint = spec.config.checkpoint
    return CheckpointSchedule(checkpoint.every_steps, spec.stop, checkpoint.every_seconds)


def store_for(spec) -> CheckpointStore:
    """The checkpoint store of a ``TrainSpec`` with a logdir: ``<logdir>/checkpoints``, keeping ``keep``."""
    return CheckpointStore(Path(spec.logdir) / "checkpoints", keep=spec.config.checkpoint.keep)


def note_resume(logdir: str | os.PathLike, checkpoint: Checkpoint, env_steps: int, digests: dict[str, str]) -> None:
    """Write ``<logdir>/resumed.json``: which checkpoint a run resumed from and the verified state digests."""
    (Path(logdir) / "resumed.json").write_text(json.dumps({
        "checkpoint": str(checkpoint.path), "env_steps": env_steps, "digests": digests}))


def state_digest(obj) -> str:
    """SHA-256 of the arrays, tensors and plain values reachable from ``obj`` (through dicts, sequences
    and objects' pickled state), each with its place, dtype and shape. Equal digests: bit-identical
    contents. Other leaves (devices, spaces' RNGs, loggers) count by type only.

    Examples:
        >>> import numpy as np
        >>> a = {"obs": np.zeros(3), "pos": 2}
        >>> state_digest(a) == state_digest({"obs": np.zeros(3), "pos": 2}), state_digest(a) == state_digest({"obs": np.ones(3), "pos": 2})
        (True, False)
    """
    digest = hashlib.sha256()
    _hash_into(digest, obj, "", {})
    return digest.hexdigest()


def _hash_into(digest, obj, place: str, seen: dict[int, object]) -> None:
    import numpy as np

    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        digest.update(f"{place}={obj!r};".encode())
        return
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        digest.update(f"{place}:{obj.dtype.str}{obj.shape};".encode())
        digest.update(np.ascontiguousarray(obj).view(np.uint8).reshape(-1).data)
        return
    if isinstance(obj, np.ndarray):  # of objects (Tianshou's per-env buffers): each element's state
        obj = obj.tolist()
    if isinstance(obj, np.generic):
        digest.update(f"{place}={obj.dtype.str}:{obj!r};".encode())
        return
    if type(obj).__module__.startswith("torch") and hasattr(obj, "untyped_storage"):  # a tensor
        flat = obj.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{place}:{obj.dtype}{tuple(obj.shape)};".encode())
        digest.update(flat.view(__import__("torch").uint8).numpy().tobytes() if flat.numel() else b"")
        return
    if id(obj) in seen:
        return
    seen[id(obj)] = obj  # held, so that no temporary state's id is reused while walking
    if isinstance(obj, dict):
        for key in sorted(obj, key=repr):
            _hash_into(digest, obj[key], f"{place}[{key!r}]", seen)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _hash_into(digest, item, f"{place}[{i}]", seen)
    else:
        digest.update(f"{place}<{type(obj).__qualname__}>;".encode())
        state = obj.__getstate__() if hasattr(obj, "__getstate__") else None
        if isinstance(state, (dict, tuple, list)):
            _hash_into(digest, state, place, seen)


def load_verified(store: CheckpointStore, first: Checkpoint, load: Callable[[Checkpoint], object],
                  digests: Callable[[object], dict[str, str]]):
    """Load ``first`` and check the rebuilt state against the digests recorded when it was written
    (``meta["digests"]`` of :meth:`CheckpointStore.save`); on a mismatch, warn and fall back to the next
    older usable checkpoint, as for a damaged file. Returns ``(loaded, checkpoint, digests)``."""
    for checkpoint in _first_then_older(store, first):
        loaded = load(checkpoint)
        recorded = store.meta(checkpoint).get("digests", {})  # checkpoints written before digests: trusted
        actual = digests(loaded)
        wrong = sorted(name for name, value in recorded.items() if actual.get(name) != value)
        if not wrong:
            return loaded, checkpoint, actual
        log.warning("rlaccel: skipping checkpoint %s: the %s loaded from it differ from what was saved "
                    "(digest mismatch)", checkpoint.path, " and ".join(wrong))
    raise ConfigError(f"--resume found no checkpoint under {store.root} that loads back to the state it saved "
                      "(see the warnings above). Fix: start the run over without --resume, or report it as a bug.")


def _first_then_older(store: CheckpointStore, first: Checkpoint):
    yield first
    yield from store.valid(below=first.step)  # checksummed only when ``first`` does not load back


def rng_state() -> dict:
    """The global RNG states a resumed run needs: torch, numpy and Python's ``random``, in types
    :func:`load_state` reads with ``weights_only=True`` (NumPy's key array as a tensor)."""
    import random

    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {"torch": torch.get_rng_state(), "numpy": (name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos,
                                                       has_gauss, cached), "python": random.getstate()}


def restore_rng(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


TRUST_VARIABLE = "RLACCEL_TRUSTED_CHECKPOINT"


def load_state(path: Path) -> Any:
    """``torch.load(path, weights_only=True)``: tensors, numbers, strings and containers of them, so a checkpoint
    from elsewhere cannot run code on ``--resume``. A file holding other objects (written by an older rlaccel)
    is refused, unless :data:`TRUST_VARIABLE` is set to 1 for a file you trust."""
    import pickle

    import torch

    if os.environ.get(TRUST_VARIABLE) == "1":
        return torch.load(path, weights_only=False)
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(f"{path} holds objects beyond tensors and numbers, which loading would run as code. "
                          f"Fix: if you trust where it came from (an older rlaccel wrote it), resume with "
                          f"{TRUST_VARIABLE}=1.") from None


class StoppedWaiting(BaseException):
    """Raised inside :func:`stop_cuts_short` when a :class:`StopSignal` arrives. A ``BaseException``, as
    ``KeyboardInterrupt`` is, so that the compiler's own ``except Exception`` handling lets it through."""


_cut_short_depth = 0  # how many stop_cuts_short blocks the main thread is inside
_listening: list[StopSignal] = []  # the StopSignal blocks the process is inside


@contextlib.contextmanager
def stop_cuts_short() -> Iterator[None]:
    """A block that a stop signal ends at once, with :class:`StoppedWaiting`, instead of the loop's next poll
    (one that arrived before the block ends it as it starts).

    For a long wait that changes no training state — compiling the update step takes 10-40 s with a cold
    cache, longer than many schedulers wait between SIGTERM and SIGKILL — whose caller can go on without it
    (the step then runs eagerly) and so reach the poll, and the checkpoint, at once. Only the main thread's
    blocks count: signal handlers run there.

    Examples:
        >>> with StopSignal() as stop:
        ...     try:
        ...         with stop_cuts_short():
        ...             signal.raise_signal(signal.SIGINT)
        ...     except StoppedWaiting:
        ...         print("cut short; received", signal.Signals(stop.received).name)
        cut short; received SIGINT
    """
    global _cut_short_depth
    main = threading.current_thread() is threading.main_thread()
    if main and any(stop.received is not None for stop in _listening):
        raise StoppedWaiting  # the signal came just before the block: nothing to wait for either
    _cut_short_depth += main
    try:
        yield
    finally:
        _cut_short_depth -= main


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the training loop polls, so it can checkpoint and stop cleanly.
    Inside a :func:`stop_cuts_short` block the signal also ends the block at once.

    A second signal of the same kind falls through to the previous handler (a double Ctrl-C still kills).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.received: int | None = None
        self._previous: dict[int, Any] = {}  # signal.signal's previous handlers

    def __enter__(self) -> StopSignal:  # noqa: PYI034 - typing.Self needs Python 3.11
        for sig in self.SIGNALS if self.enabled else ():
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        _listening.append(self)
        return self

    def _handle(self, signum, frame) -> None:
        if self.received == signum:
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            raise KeyboardInterrupt
        self.received = signum
        if _cut_short_depth:
            raise StoppedWaiting

    def __exit__(self, *exc) -> None:
        if self in _listening:
            _listening.remove(self)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
