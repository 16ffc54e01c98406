"""Replace an SB3 model's methods (``train``, and collection's ``_sample_action``, ``collect_rollouts``,
``_store_transition``, ``_on_step``) for the length of a ``learn()``,
invisibly to ``model.save()``.

SB3 saves a model's ``__dict__`` minus ``_excluded_save_params()``: an instance attribute ``train``
would be pickled into ``model.zip`` (a closure over the model). :func:`override_method` sets it together
with an instance ``_excluded_save_params`` that leaves out every override and itself;
:func:`remove_override` takes them away again.
"""

from __future__ import annotations

import types
from collections.abc import Callable

OVERRIDABLE = ("train", "_sample_action", "collect_rollouts", "_store_transition", "_on_step")
EXCLUDER = "_excluded_save_params"


def override_method(model, name: str, method: Callable) -> None:
    """Make ``method`` the model's ``name`` (SB3's loops call ``self.train``, ``self._sample_action``, ...)."""
    if name not in OVERRIDABLE:
        raise ValueError(f"name must be one of {OVERRIDABLE}, got name={name!r}")
    model.__dict__[name] = method
    model.__dict__[EXCLUDER] = types.MethodType(_excluded_with_overrides, model)


def remove_override(model, name: str) -> None:
    """Back to the class's own method (what the override holds, e.g. CUDA graphs, released); a no-op
    without an override."""
    release = getattr(model.__dict__.get(name), "release", None)
    if release is not None:
        release()
    model.__dict__.pop(name, None)
    if not any(n in model.__dict__ for n in OVERRIDABLE):  # the last one gone
        model.__dict__.pop(EXCLUDER, None)


def override_train(model, train: Callable) -> None:
    """Make ``train`` the model's ``train()`` (SB3's ``learn`` calls ``self.train``)."""
    override_method(model, "train", train)


def remove_train_override(model) -> None:
    """Back to the class's own ``train()``; a no-op without an override."""
    remove_override(model, "train")


def override_policy_forward(policy, forward: Callable) -> None:
    """Make ``forward`` the policy's ``forward`` (``policy(obs)`` in on-policy collection calls it). The
    policy is saved as its ``state_dict``, which holds no attribute of this kind."""
    policy.__dict__["forward"] = forward


def remove_policy_forward(policy) -> None:
    """Back to the policy class's own ``forward``; a no-op without an override."""
    policy.__dict__.pop("forward", None)


def _excluded_with_overrides(model) -> list[str]:
    return [*type(model)._excluded_save_params(model), *OVERRIDABLE, EXCLUDER]
