"""Which framework code each fused or lean path was verified against, and whether it is still installed.

A fused update or lean collection stands in for framework methods and mirrors others (a sampler's
draw order, a private helper it reads). Each adapter lists them — one :class:`Replacement` per
path, naming every method it replaces or mirrors — and records, in a JSON file beside its code,
the framework versions it was verified with and a fingerprint of each method: a SHA-256 of the
method's syntax tree with docstrings dropped, so comments, formatting and docstrings do not count and
every Python version we support gives the same digest.

At install time (``AccelerateCallback``, ``accelerate()``, ``SparseDenseWrapper``,
``LeanCollector``) the adapter asks :func:`unverified`; where the installed code differs, ``auto``
runs the framework's own method (one warning) and ``true`` refuses
(:func:`rlaccel_plugins.fused.selection.select_fused`). After a framework upgrade, re-run the
equivalence tests, then re-record::

    python -m tools.fingerprints --update

(without ``--update`` it prints what differs; CI's test does the same and fails until the record is
updated.)
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import json
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

REPORT_TO = "the rlaccel maintainers, with the output of `rlaccel env` (docs: Reliability, reporting a problem)"
_SKIPPED_FIELDS = {"ctx", "type_comment", "kind", "lineno", "col_offset", "end_lineno", "end_col_offset"}


@dataclass(frozen=True)
class Replacement:
    """One fused or lean path: the framework methods it replaces or mirrors (``"module:Class.attr"``).

    Examples:
        >>> Replacement("train:DQN", ("stable_baselines3.dqn.dqn:DQN.train",)).targets
        ('stable_baselines3.dqn.dqn:DQN.train',)
    """

    key: str
    targets: tuple[str, ...]


def _canonical(node: Any) -> Any:
    """A syntax tree as plain data: node names and fields, without positions, contexts or empty fields
    (so a field a newer Python adds empty, like ``type_params``, changes nothing)."""
    if isinstance(node, ast.AST):
        fields = {}
        for name, value in ast.iter_fields(node):
            if name in _SKIPPED_FIELDS or value is None or value == []:
                continue
            fields[name] = _canonical(value)
        return [type(node).__name__, fields]
    if isinstance(node, list):
        return [_canonical(item) for item in node]
    return repr(node)


def _drop_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def source_fingerprint(source: str) -> str:
    """SHA-256 of the code in ``source`` with comments, formatting and docstrings left out.

    Examples:
        >>> a = source_fingerprint("def f(x):\\n    '''Doc.'''\\n    return x + 1  # add one\\n")
        >>> a == source_fingerprint("def f(x):   return (x + 1)")
        True
        >>> a == source_fingerprint("def f(x):\\n    return x + 2\\n")
        False
    """
    tree = _drop_docstrings(ast.parse(textwrap.dedent(source)))
    return hashlib.sha256(json.dumps(_canonical(tree)).encode()).hexdigest()


def resolve(target: str) -> Any:
    """The object ``"package.module:Class.attr"`` names (functions unwrapped, properties to their getter)."""
    module_name, _, path = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in path.split(".") if path else ():
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    return inspect.unwrap(obj) if callable(obj) else obj


@functools.cache
def fingerprint(target: str) -> str:
    """The fingerprint of the installed code ``target`` names (cached: it is read once per process)."""
    return source_fingerprint(inspect.getsource(resolve(target)))


@dataclass(frozen=True)
class Record:
    """What an adapter's paths were verified against: framework versions and one digest per target."""

    versions: dict[str, list[str]]          # distribution -> versions verified
    digests: dict[str, dict[str, str]]      # replacement key -> {target: digest}

    @classmethod
    def load(cls, path: str | Path) -> Record:
        data = json.loads(Path(path).read_text())
        return cls(versions=data["versions"], digests=data["digests"])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"versions": self.versions, "digests": self.digests}, indent=2,
                                         sort_keys=True) + "\n")


def installed_versions(distributions: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name in distributions:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass(frozen=True)
class VerifiedCode:
    """An adapter's replacements, its record file and the distributions whose versions it names."""

    replacements: Mapping[str, Replacement]
    record_path: Path
    distributions: tuple[str, ...]

    def differences(self, key: str, record: Record | None = None) -> list[str]:
        """The targets of ``key`` whose installed code differs from the record (unrecorded ones included)."""
        record = record or load_record(self.record_path)
        recorded = record.digests.get(key, {})
        out = []
        for target in self.replacements[key].targets:
            try:
                current = fingerprint(target)
            except (ImportError, AttributeError, OSError, TypeError):
                current = None
            if current is None or recorded.get(target) != current:
                out.append(target)
        return out

    def unverified(self, key: str) -> str | None:
        """Why the path ``key`` is not verified against the installed framework, or None where it is."""
        if key not in self.replacements:  # fails closed: a path nobody listed was never checked
            return (f"rlaccel lists no framework code for {key!r}, so it was never verified against the installed "
                    f"framework (known: {', '.join(sorted(self.replacements))}). Report it to {REPORT_TO}.")
        record = load_record(self.record_path)
        changed = self.differences(key, record)
        if not changed:
            return None
        installed = ", ".join(f"{k} {v}" for k, v in installed_versions(self.distributions).items())
        verified = ", ".join(f"{k} {', '.join(v)}" for k, v in sorted(record.versions.items()))
        return (f"the installed code of {', '.join(changed)} ({installed}) differs from the code rlaccel's "
                f"{key} was verified against ({verified}). Report it to {REPORT_TO}.")

    def record(self, previous: Record | None = None) -> Record:
        """A record of the installed code (verified versions accumulate while the digests stay equal)."""
        digests = {key: {t: fingerprint(t) for t in r.targets} for key, r in self.replacements.items()}
        versions = {k: [v] for k, v in installed_versions(self.distributions).items()}
        if previous is not None and previous.digests == digests:
            versions = {k: sorted(set(previous.versions.get(k, [])) | set(v)) for k, v in versions.items()}
        return Record(versions=versions, digests=digests)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime: float) -> Record:
    return Record.load(path)


def load_record(path: Path) -> Record:
    if not path.exists():
        return Record(versions={}, digests={})
    return _load_cached(str(path), path.stat().st_mtime)


def adapters_code() -> dict[str, VerifiedCode]:
    """Each installed adapter's :class:`VerifiedCode` (the methods its fused paths replace, and their record)."""
    from rlaccel_plugins.plugins import get_plugin_manager

    out = {}
    for spec in get_plugin_manager().adapters:
        if spec.available and spec.verified:
            out[spec.name] = spec.load("verified")
    return out
