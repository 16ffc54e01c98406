"""Replace an SB3 model's ``train`` for the length of a ``learn()``, invisibly to ``model.save()``.

SB3 saves a model's ``__dict__`` minus ``_excluded_save_params()``: an instance attribute ``train``
would be pickled into ``model.zip`` (a closure over the model). :func:`override_train` sets it together
with an instance ``_excluded_save_params`` that leaves out both; :func:`remove_train_override` takes
both away again.
"""

from __future__ import annotations

import types
from collections.abc import Callable

OVERRIDES = ("train", "_excluded_save_params")


def override_train(model, train: Callable) -> None:
    """Make ``train`` the model's ``train()`` (SB3's ``learn`` calls ``self.train``)."""
    model.__dict__["train"] = train
    model.__dict__["_excluded_save_params"] = types.MethodType(_excluded_with_overrides, model)


def remove_train_override(model) -> None:
    """Back to the class's own ``train()`` (what the override holds, e.g. CUDA graphs, released);
    a no-op without an override."""
    release = getattr(model.__dict__.get("train"), "release", None)
    if release is not None:
        release()
    for name in OVERRIDES:
        model.__dict__.pop(name, None)


def overridden_train(model) -> Callable | None:
    """The ``train`` installed by :func:`override_train`, or None."""
    return model.__dict__.get("train")


def _excluded_with_overrides(model) -> list[str]:
    return [*type(model)._excluded_save_params(model), *OVERRIDES]
