"""The private PyTorch APIs a compiled step stands on, probed once per process.

A compiled step (:mod:`rlaccel_plugins.fused.compiled_step`) reads the optimizer's step hooks and makes
Adam's state as Adam makes it, runs a loop of steps through ``torch._higher_order_ops.scan``, and keeps
its compiled code on disk through ``torch.compile``'s ahead-of-time API
(:mod:`rlaccel_plugins.fused.compiled_cache`). None of these is a stable API: each is looked up here, once,
and checked to be what the code expects. :func:`compile_unsupported` says what is missing; where something
is, the compiled step is not made and the eager fused step runs, after one warning. :func:`persist_unsupported`
says why compiled code cannot be kept on disk; then each process compiles its own (no warning: only
slower to start).

Examples:
    >>> from rlaccel_plugins.fused.torch_support import compile_unsupported, private_apis
    >>> compile_unsupported() is None  # this PyTorch has what a compiled step uses
    True
    >>> private_apis().scalar_dtype()
    torch.float32
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# what a compiled step uses that PyTorch does not promise to keep: name -> where it is looked up, and what
# it must be
COMPILE_APIS: dict[str, tuple[str, Callable[[Any], bool]]] = {"is_compiling": ("torch.compiler:is_compiling", callable),
                "grad": ("torch.func:grad", callable),
                "scan": ("torch._higher_order_ops.scan:scan", callable),
                "scalar_dtype": ("torch.optim.optimizer:_get_scalar_dtype", lambda f: isinstance(f(), torch.dtype)),
                "global_pre_hooks": ("torch.optim.optimizer:_global_optimizer_pre_hooks",
                                     lambda d: isinstance(d, dict)),
                "global_post_hooks": ("torch.optim.optimizer:_global_optimizer_post_hooks",
                                      lambda d: isinstance(d, dict))}
# an optimizer's own step hooks (pre, post): attributes every optimizer must have, dicts
INSTANCE_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")


@dataclass(frozen=True)
class PrivateApis:
    """The private names a compiled step calls, as found on this PyTorch."""

    scan: Callable
    scalar_dtype: Callable[[], torch.dtype]
    global_pre_hooks: dict
    global_post_hooks: dict


@functools.cache
def private_apis() -> PrivateApis | str:
    """The private APIs, or what is missing or not as expected (a string naming it)."""
    found, missing = {}, []
    for name, (where, expected) in COMPILE_APIS.items():
        value = _lookup(where)
        if value is None or not _holds(expected, value):
            missing.append(where.replace(":", "."))
        found[name] = value
    probe = torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    missing += [f"Optimizer.{name}" for name in INSTANCE_HOOKS if not isinstance(getattr(probe, name, None), dict)]
    if missing:
        return f"this PyTorch ({torch.__version__}) lacks or changed {', '.join(missing)}"
    return PrivateApis(found["scan"], found["scalar_dtype"], found["global_pre_hooks"], found["global_post_hooks"])


def compile_unsupported(warn: bool = False) -> str | None:
    """Why this PyTorch cannot run a compiled step, or None. ``warn``: say so once per process (the
    caller then runs the eager fused step)."""
    apis = private_apis()
    if not isinstance(apis, str):
        return None
    if warn and not _warned:
        from rlaccel_plugins.errors import RlaccelWarning

        _warned.append(apis)
        warnings.warn(f"rlaccel: compiled updates are off: {apis}; the eager fused update runs instead "
                      "(the same math, slower).", RlaccelWarning, stacklevel=3)
    return f"{apis} (the compiled step uses it)"


_warned: list[str] = []


# what keeping compiled code on disk uses besides
PERSIST_APIS = ("torch.compiler:load_compiled_function", "torch._guards:tracing", "torch._guards:TracingContext",
                "torch._dynamo.guards:CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES")


@functools.cache
def persist_unsupported() -> str | None:
    """Why compiled steps cannot be kept on disk on this PyTorch, or None."""
    missing = [where.replace(":", ".") for where in PERSIST_APIS if _lookup(where) is None]
    if not hasattr(torch.compile(lambda x: x), "aot_compile"):
        missing.append("torch.compile(...).aot_compile")
    return f"this PyTorch ({torch.__version__}) lacks {', '.join(missing)}" if missing else None


def step_hooks(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """``optimizer``'s own step pre- and post-hooks (found by :func:`private_apis`)."""
    pre, post = INSTANCE_HOOKS
    return getattr(optimizer, pre), getattr(optimizer, post)


def _lookup(where: str) -> Any:
    """The object at ``"module:attribute.attribute"``, or None where it is not there."""
    import importlib

    module, _, path = where.partition(":")
    try:
        value: Any = importlib.import_module(module)
    except ImportError:
        return None
    for part in path.split("."):
        value = getattr(value, part, None)
    return value


def _holds(expected: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(expected(value))
    except Exception:  # noqa: BLE001 - whatever a changed API raises, it is not what the code expects
        return False


def reset() -> None:
    """Probe again (tests that take an API away)."""
    private_apis.cache_clear()
    persist_unsupported.cache_clear()
    _warned.clear()
