"""Mixed precision on the update path: ``precision.dtype`` -> an autocast context.

``bf16`` and ``fp16`` autocast the forward passes of a gradient step (CPU and CUDA); parameters,
gradients and optimizer states stay fp32. ``fp16`` also needs loss scaling (its gradients underflow):
the gradient guard (:class:`~rlaccel_plugins.updates.guard.GradientGuard`) owns a :class:`~rlaccel_plugins.updates.loss_scale.LossScaler`, applied inside the framework's own
``loss.backward()``. ``auto``: bf16 on a CUDA GPU that supports it, fp16 on an older GPU, fp32 on CPU
(CPU autocast is slower than fp32 on CPUs without bf16/fp16 units).

Examples:
    >>> import torch
    >>> with update_autocast("bf16", "cpu"):
    ...     torch.nn.Linear(4, 2)(torch.ones(1, 4)).dtype
    torch.bfloat16
    >>> with update_autocast("fp32", "cpu"):
    ...     torch.nn.Linear(4, 2)(torch.ones(1, 4)).dtype
    torch.float32
"""

from __future__ import annotations

import contextlib

from rlaccel_plugins.errors import ConfigError


def resolve_dtype(dtype: str, device: str) -> str:
    """The concrete precision for ``dtype`` (may be ``"auto"``) on ``device``."""
    if dtype == "auto":
        from rlaccel_plugins.hardware import _auto_precision

        return _auto_precision(device)
    return dtype


def update_autocast(dtype: str, device: str = "cpu", guard=None):
    """A context manager that runs the enclosed update in ``dtype`` (fp32: does nothing). fp16 needs
    ``guard``, a :class:`~rlaccel_plugins.updates.guard.GradientGuard` with a loss scaler
    (``GradientGuard.from_config(config, device)`` makes one)."""
    import torch

    dtype = resolve_dtype(dtype, device)
    if dtype == "fp32":
        return contextlib.nullcontext()
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    # cache_enabled=False: autocast caches the half-precision copy of each weight until the context
    # exits, and the frameworks take several optimizer steps inside one update context; with the
    # cache every step after the first would run on the first step's weights.
    autocast = torch.autocast(device_type=device_type, dtype=torch.float16 if dtype == "fp16" else torch.bfloat16,
                              cache_enabled=False)
    if dtype == "bf16":
        return autocast
    if guard is None or guard.loss_scaler is None:
        raise ConfigError("dtype='fp16' needs loss scaling: pass the GradientGuard made by "
                          "GradientGuard.from_config(config, device) as guard=. Fix: or use dtype: bf16.")
    stack = contextlib.ExitStack()
    stack.enter_context(autocast)
    stack.enter_context(guard.loss_scaler.scaling())
    return stack
