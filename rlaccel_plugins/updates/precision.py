"""Mixed precision on the update path: ``precision.dtype`` -> an autocast context.

``bf16`` and ``fp16`` autocast the forward passes of a gradient step (CPU and CUDA); parameters,
gradients and optimizer states stay fp32. ``fp16`` also needs loss scaling (its gradients underflow):
the gradient guard (:class:`~rlaccel_plugins.updates.guard.GradientGuard`) owns a
:class:`~rlaccel_plugins.updates.loss_scale.LossScaler`, applied inside the framework's own
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
        from rlaccel_plugins.hardware import auto_precision

        return auto_precision(device)
    return dtype


def update_autocast(dtype: str, device: str = "cpu", guard=None, fp32_outputs_of=()):
    """A context manager that runs the enclosed update in ``dtype`` (fp32: does nothing). fp16 needs
    ``guard``, a :class:`~rlaccel_plugins.updates.guard.GradientGuard` with a loss scaler
    (``GradientGuard.from_config(config, device)`` makes one). The outputs of the modules in
    ``fp32_outputs_of`` are cast back to fp32, so the framework's loss compares fp32 with fp32."""
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
    if dtype == "fp16" and (guard is None or guard.loss_scaler is None):
        raise ConfigError("dtype='fp16' needs loss scaling: pass the GradientGuard made by "
                          "GradientGuard.from_config(config, device) as guard=. Fix: or use dtype: bf16.")
    stack = contextlib.ExitStack()
    stack.enter_context(autocast)
    if dtype == "fp16":
        stack.enter_context(guard.loss_scaler.scaling())
    for module in fp32_outputs_of:
        stack.callback(module.register_forward_hook(_outputs_in_fp32).remove)
    return stack


def _outputs_in_fp32(module, args, output):
    # Tianshou casts its n-step returns to the Q-values' dtype (to_torch_as): in bf16 they would be
    # rounded to 3 significant digits before the TD error is taken
    return _to_fp32(output)


def _to_fp32(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, (tuple, list)):
        return type(value)(_to_fp32(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_fp32(v) for k, v in value.items()}
    if callable(getattr(value, "items", None)) and hasattr(value, "__setitem__"):  # e.g. Tianshou's Batch
        for key, item in list(value.items()):
            value[key] = _to_fp32(item)
    return value
