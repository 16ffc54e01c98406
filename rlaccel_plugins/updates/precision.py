"""Mixed precision on the update path: ``precision.dtype`` -> an autocast context.

``bf16`` autocasts the forward passes of a gradient step (CPU and CUDA); parameters, gradients and
optimizer states stay fp32, so no loss scaling is needed. ``fp16`` needs a ``GradScaler`` around the
framework's own ``loss.backward()``, which rlaccel cannot insert into SB3's or Tianshou's update code,
so it is refused with a clear error rather than run unscaled. ``auto``: bf16 on a CUDA GPU that
supports it, fp32 elsewhere (CPU bf16 autocast is slower than fp32 on CPUs without bf16 units).

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

        dtype = _auto_precision(device)
        return "bf16" if dtype == "fp16" else dtype  # fp16 needs a loss scaler we cannot insert
    if dtype == "fp16":
        raise ConfigError("dtype must be fp32, bf16 or auto for rlaccel's update path, got dtype='fp16': fp16 "
                          "needs a GradScaler around the framework's own loss.backward(), which rlaccel cannot "
                          "insert. Fix: use dtype: bf16 (no loss scaling needed).")
    return dtype


def update_autocast(dtype: str, device: str = "cpu"):
    """A context manager that runs the enclosed forward passes in ``dtype`` (fp32: does nothing)."""
    import torch

    dtype = resolve_dtype(dtype, device)
    if dtype == "fp32":
        return contextlib.nullcontext()
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
