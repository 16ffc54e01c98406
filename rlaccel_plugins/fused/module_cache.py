"""Results built from a module tree, kept while the tree stays the same.

A fused update builds things from the framework's networks on every call: flat forwards
(:mod:`rlaccel_plugins.fused.flat`), parameter lists for the target update, whether the layers care about
train/eval mode. Each walks the tree through ``named_modules`` generators, which for an actor-critic
with target networks costs a noticeable share of a small update. :func:`cached` keeps such a result
per module and checks a snapshot of the tree instead: the same submodules and parameter objects in
every module, and no hooks that a module's call runs (forward or backward, on a module or global). Any
change rebuilds the result. A parameter updated in place or moved by ``Module.to`` is the same object,
so it changes nothing that is cached.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> params = cached(net, "params", lambda: list(net.parameters()))
    >>> cached(net, "params", lambda: []) is params
    True
    >>> _ = net.append(torch.nn.Linear(2, 1))
    >>> len(cached(net, "params", lambda: list(net.parameters())))
    4
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.nn.modules import module as torch_module

T = TypeVar("T")


def has_uninitialized(*modules: torch.nn.Module) -> bool:
    """Whether a lazy layer (``LazyLinear``, ``LazyBatchNorm1d``...) in ``modules`` has not created its
    weights or buffers yet: they appear in its first forward (an ``UninitializedParameter`` until then).

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.LazyLinear(2))
        >>> has_uninitialized(net), has_uninitialized(torch.nn.Linear(2, 2))
        (True, False)
        >>> _ = net(torch.zeros(1, 3))
        >>> has_uninitialized(net)
        False
    """
    return any(torch.nn.parameter.is_lazy(t) for m in modules for t in itertools.chain(m.parameters(), m.buffers()))


def has_call_hooks(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs a hook of its own (forward, forward-pre, backward, backward-pre)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def global_call_hooks() -> bool:
    """Whether a global module hook is registered (``register_module_forward_hook`` and the like)."""
    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
                or torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks)


class _Snapshot:
    """A module tree's structure — each module's children and parameter objects — and what was built from it.

    The check reads the dicts every module keeps them in (``_modules``, ``_parameters`` and the four call
    hook dicts; ``Module`` edits them in place and never replaces them): their lengths, and their entries
    by identity (``operator.is_``: tensors compare by value), over one flat sequence (faster than a walk module
    by module)."""

    __slots__ = ("checked", "containers", "entries", "hook_dicts", "hooked", "lengths", "results")

    def __init__(self, root: torch.nn.Module, epoch: int | None) -> None:
        modules = list(root.modules())
        self.containers = [d for m in modules for d in (m._modules, m._parameters)]
        self.hook_dicts = [d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks,
                                                        m._backward_pre_hooks)]
        self.lengths = [len(d) for d in self.containers]
        self.entries = [v for d in self.containers for v in d.values()]
        self.results: dict[str, Any] = {}
        self.checked = epoch
        # built while a hook was registered: what was built then is not kept (the hook may go again)
        self.hooked = global_call_hooks() or any(self.hook_dicts)

    def unchanged(self) -> bool:
        return not (self.hooked or global_call_hooks() or any(self.hook_dicts)) \
            and list(map(len, self.containers)) == self.lengths \
            and all(map(operator.is_, itertools.chain.from_iterable(map(dict.values, self.containers)),  # type: ignore[arg-type]
                        self.entries))


_SNAPSHOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_EPOCHS = itertools.count()


def new_epoch() -> int:
    """A fresh ``epoch`` for :func:`cached` (e.g. one per update), unique across every caller: calls with
    it check each module's tree once."""
    return next(_EPOCHS)


def cached(module: torch.nn.Module, key: str, build: Callable[[], T], epoch: int | None = None) -> T:
    """``build()``, kept per ``module`` and ``key`` until the module's tree changes (submodules,
    parameter objects, call hooks). Calls with the same non-None ``epoch`` (e.g. one update) check the
    tree once."""
    snapshot = _SNAPSHOTS.get(module)
    if snapshot is not None and (epoch is None or snapshot.checked != epoch):
        if snapshot.unchanged():
            snapshot.checked = epoch
        else:
            snapshot = None
    if snapshot is None:
        snapshot = _SNAPSHOTS[module] = _Snapshot(module, epoch)
    results = snapshot.results
    if key not in results:
        results[key] = build()
    return results[key]


def parameters(module: torch.nn.Module, epoch: int | None = None) -> list[torch.nn.Parameter]:
    """``list(module.parameters())``, listed again only when the module's tree changes (do not modify it)."""
    return cached(module, "parameters", lambda: list(module.parameters()), epoch)


def flags_set_mode(modules: list[torch.nn.Module]) -> bool:
    """Whether writing ``module.__dict__["training"]`` on each of ``modules`` does what ``Module.train`` does
    (no class among them overrides ``train`` or ``__setattr__``), without ``train``'s walk of the tree."""
    return all(type(m).train is torch.nn.Module.train and type(m).__setattr__ is torch.nn.Module.__setattr__
               for m in modules)
