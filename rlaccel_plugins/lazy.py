"""Lazy package exports: public names import their module on first use (keeps imports light)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose ``names`` map to the modules defining them.

    Call it at the end of the package's ``__init__``: ``__getattr__, __dir__ = lazy_exports(__name__, NAMES)``.

    Examples:
        >>> getattr_, dir_ = lazy_exports("demo", {"dumps": "json"})
        >>> getattr_("dumps")([1])
        '[1]'
    """
    namespace = sys.modules[package].__dict__ if package in sys.modules else {}

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value  # cached: later lookups skip __getattr__
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
