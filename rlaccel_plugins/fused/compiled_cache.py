"""Compiled steps kept on disk: the first process on a machine compiles a step, every later one loads it.

``torch.compile`` traces a function anew in every process (dynamo, then AOTAutograd), even where
inductor's own cache then finds the generated code: for SB3 DQN's loop of 128 steps that is about 11 s of
a new process's first ``train()`` on a 2-core CPU (31 s with inductor's cache empty). :class:`PersistedCompile`
compiles ahead of time instead (``torch.compile(...).aot_compile``) and saves the result — the traced
graph, its guards and inductor's code — in a per-user folder (:func:`cache_dir`); a later process loads it
in about 2 s, with no tracing.

Each saved step is keyed by what its code depends on (:func:`artifact_key`): the PyTorch version, the CPU's
instruction set, the compile options, the step function and every function it is given (by name and by
the source of their modules — all of rlaccel's, so upgrading or editing rlaccel compiles anew), and every argument's shape,
dtype and constant value. The loaded step also checks its guards on each call, as ``torch.compile`` does:
tensor shapes and strides, constants, the grad mode. Guards that name a Python object's identity in the
process that compiled it (a function, a module) cannot be saved; the key covers them instead.

Set ``RLACCEL_CACHE_DIR`` to move the folder, or delete it to start over. Where saving or loading is not
possible (:func:`~rlaccel_plugins.fused.torch_support.persist_unsupported`), each process compiles its own.

Examples:
    >>> from rlaccel_plugins.fused.compiled_cache import artifact_key, cache_dir
    >>> import torch
    >>> key = artifact_key(torch.add, (torch.zeros(2, 3), 1.5), {})
    >>> key == artifact_key(torch.add, (torch.ones(2, 3), 1.5), {})  # values of tensors do not matter
    True
    >>> key == artifact_key(torch.add, (torch.zeros(2, 3), 2.0), {})  # constants do
    False
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rlaccel_plugins.checkpoint import stop_cuts_short

log = logging.getLogger(__name__)

_GUARD_FAILED = "GuardManager check failed"
_IN_PROCESS: dict[str, Callable] = {}  # key -> loaded or compiled step, shared by the models of a process


def cache_dir() -> Path:
    """Where compiled steps are kept: ``$RLACCEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlaccel/compiled``
    (``~/.cache/rlaccel/compiled``)."""
    if os.environ.get("RLACCEL_CACHE_DIR"):
        return Path(os.environ["RLACCEL_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlaccel" / "compiled"


class PersistedCompile:
    """``function`` compiled ahead of time for each signature it is called with, loaded from
    :func:`cache_dir` where an earlier process saved it. ``events``: what each signature cost,
    ``(\"compiled\" | \"loaded\", seconds)``."""

    def __init__(self, function: Callable, options: dict[str, Any]) -> None:
        self.function, self.options = function, options
        self.events: list[tuple[str, float]] = []
        self._current: Any = None

    def __call__(self, *args: Any) -> Any:
        if self._current is not None:
            try:
                return self._current(*args)
            except RuntimeError as error:  # another signature than the last call's: find its step
                if not str(error).startswith(_GUARD_FAILED):
                    raise
        self._current = self._step_for(args)
        return self._current(*args)

    def _step_for(self, args: tuple) -> Callable:
        key = artifact_key(self.function, args, self.options)
        if key in _IN_PROCESS:
            return _IN_PROCESS[key]
        path = cache_dir() / f"{key}.bin"
        start = time.perf_counter()
        with stop_cuts_short():  # nothing is trained while it loads or compiles: a stop need not wait for it
            step = _load(path, self.function, args) if path.exists() else None
            if step is not None:
                self.events.append(("loaded", time.perf_counter() - start))
            else:
                step = self._compile(args, path)
                self.events.append(("compiled", time.perf_counter() - start))
        _IN_PROCESS[key] = step
        return step

    def _compile(self, args: tuple, path: Path) -> Callable:
        options = {**self.options, "guard_filter_fn": _savable_guards}
        compiled: Any = torch.compile(self.function, fullgraph=True, dynamic=False, options=options)
        with _inductor_folder(path):
            step = compiled.aot_compile((args, {}))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            step.save_compiled_function(str(path))  # written to a temporary file, then renamed
        except Exception as error:  # noqa: BLE001 - a read-only home, an object the pickler refuses: still compiled
            log.info("rlaccel: compiled step not saved to %s (%s: %s)", path, type(error).__name__, error)
        return step


@contextlib.contextmanager
def _inductor_folder(path: Path) -> Iterator[None]:
    """Inductor's files for the step saved at ``path`` (its C++ libraries, AOTAutograd's cache) in a folder
    of their own beside it. Loading then finds the libraries whatever became of inductor's own folder in
    ``/tmp`` (rebuilding them costs ~15 s), and no other step's AOTAutograd entry is found: in a shared
    folder, torch 2.13 handed a loop compiled for 8 steps to a later compilation of 64 ("expected size
    64==8" when it ran)."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path.with_suffix(".inductor"))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def _load(path: Path, function: Callable, args: tuple) -> Any:
    """The step saved at ``path``, or None where it cannot be loaded or its guards refuse ``args``."""
    from torch._guards import TracingContext, tracing

    try:
        # some guard sources (an import inside torch.func.grad) install a guard as they are unpickled,
        # which needs a tracing context to put it in
        with open(path, "rb") as file, tracing(TracingContext(None)), _inductor_folder(path):
            step: Any = torch.compiler.load_compiled_function(file, f_globals=function.__globals__)
        if step.guard_check(*args):
            return step
        log.info("rlaccel: the compiled step at %s does not fit this call; compiling anew", path)
    except Exception as error:  # noqa: BLE001 - a file from another PyTorch, cut short, unreadable: compile anew
        log.info("rlaccel: could not load the compiled step at %s (%s: %s)", path, type(error).__name__, error)
    return None


def _savable_guards(entries: list) -> list[bool]:
    """Keep every guard that can be saved and :func:`thread_independent_guards` keeps; those that name a
    Python object's identity cannot be saved, and the artifact key covers what they check."""
    from torch._dynamo.guards import CheckFunctionManager

    unsavable = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [keep and entry.guard_type not in unsavable and not unsavable.intersection(entry.derived_guard_types or ())
            for entry, keep in zip(entries, thread_independent_guards(entries))]


def thread_independent_guards(entries: list) -> list[bool]:
    """Every guard but the global-state one: it holds torch's thread count, which the thread policy
    (:mod:`rlaccel_plugins.threads`) changes during a run and a step compiled with ``cpp.threads=1`` does not
    depend on. Grad mode and deterministic algorithms have guards of their own; no step is compiled or
    called under autocast."""
    return [entry.guard_type != "GLOBAL_STATE" for entry in entries]


def artifact_key(function: Callable, args: tuple, options: dict[str, Any]) -> str:
    """A name for ``function``'s compiled code for ``args``: equal only where the code would be."""
    functions: list[Callable] = [function]
    signature = _signature(args, functions)
    parts = (torch.__version__, torch.backends.cpu.get_cpu_capability(), sys.version_info[:2],
             sorted(options.items()), signature, [_source_hash(f) for f in functions])
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _signature(value: Any, functions: list[Callable]) -> Any:
    """``value`` with tensors replaced by their layout and functions by their names (collected)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype), str(value.device))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_signature(v, functions) for v in value))
    if callable(value):
        functions.append(value)
        return ("function", getattr(value, "__module__", None), getattr(value, "__qualname__", repr(value)))
    return (type(value).__name__, repr(value))


def _source_hash(function: Callable) -> str:
    """The source of ``function``'s module, or of every rlaccel package where it is one of rlaccel's (the
    functions a step calls, such as the flat networks, live in other modules than the step)."""
    module = getattr(function, "__module__", None) or ""
    return _rlaccel_source_hash() if module.startswith("rlaccel") else _module_source_hash(module)


@functools.cache
def _rlaccel_source_hash() -> str:
    digest = hashlib.sha256()
    for name in sorted(n for n in sys.modules if n.startswith("rlaccel") and "." not in n):
        folder = Path(getattr(sys.modules[name], "__file__", None) or ".").parent
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.relative_to(folder).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _module_source_hash(module_name: str) -> str:
    module = sys.modules.get(module_name)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        source = ""
    return hashlib.sha256(source.encode()).hexdigest()[:16]
