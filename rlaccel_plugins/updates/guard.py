"""Gradient safety on any torch optimizer: clip the gradient norm, skip a step whose gradients are not
finite instead of writing NaN/Inf into the weights, and optionally (``restore_last_good``) undo a step
that made the weights non-finite anyway. The restore option copies the weights and the
optimizer state before every step, so it costs memory and time: meant for debugging unstable runs.
With fp16 updates the guard also owns the :class:`~rlaccel_plugins.updates.loss_scale.LossScaler`:
an overflowing step is skipped and the scale backed off, as ``GradScaler`` does.

A NaN or Inf loss makes every gradient non-finite, so checking the gradient norm catches both.

Examples:
    >>> import torch
    >>> net = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
    >>> guard = GradientGuard(max_grad_norm=1.0)
    >>> guard.attach(opt)
    >>> net(torch.tensor([[float("nan"), 0.0]])).sum().backward()
    >>> before = net.weight.detach().clone()
    >>> opt.step()
    >>> torch.equal(before, net.weight), guard.stats["skipped_steps"]
    (True, 1)
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from rlaccel_plugins.fused.kernels import clip_grad_norm, total_norm
from rlaccel_plugins.updates.loss_scale import LossScaler

log = logging.getLogger("rlaccel")


class GradientGuard:
    """Wraps ``optimizer.step`` of attached optimizers: clip to ``max_grad_norm`` (None: no clipping),
    and with ``skip_nonfinite`` drop steps whose gradient norm is NaN/Inf (counted and logged)."""

    def __init__(self, max_grad_norm: float | None = None, skip_nonfinite: bool = True,
                 restore_last_good: bool = False, loss_scaler: LossScaler | None = None) -> None:
        self.max_grad_norm = max_grad_norm
        self.skip_nonfinite = skip_nonfinite or loss_scaler is not None
        self.restore_last_good = restore_last_good
        self.loss_scaler = loss_scaler
        self.stats: dict[str, float] = {"skipped_steps": 0, "clipped_steps": 0, "guarded_steps": 0, "restored_steps": 0}
        self._originals: dict[int, tuple[Any, Any]] = {}

    @classmethod
    def from_config(cls, config, device: str = "cpu") -> GradientGuard | None:
        """The guard a config asks for on ``device``, or None when it asks for nothing."""
        from rlaccel_plugins.updates.precision import resolve_dtype

        precision = config.precision
        scaler = LossScaler() if resolve_dtype(precision.dtype, device) == "fp16" else None
        if precision.max_grad_norm is None and not precision.skip_nonfinite and not precision.restore_last_good \
                and scaler is None:
            return None
        return cls(precision.max_grad_norm, precision.skip_nonfinite, precision.restore_last_good, scaler)

    def state_dict(self) -> dict[str, Any]:
        """The counters and the fp16 loss scale, to go on with them (a later ``learn()``, a resumed run)."""
        return {"stats": dict(self.stats),
                "loss_scale": self.loss_scaler.state_dict() if self.loss_scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.update(state.get("stats", {}))
        if self.loss_scaler is not None and state.get("loss_scale") is not None:
            self.loss_scaler.load_state_dict(state["loss_scale"])

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._originals:
            return
        original = optimizer.step

        def guarded_step(*args: Any, **kwargs: Any):
            if not self.allows_step(optimizer):
                return None
            if not self.restore_last_good:
                return original(*args, **kwargs)
            saved = _snapshot(optimizer)  # the weights and optimizer state before this step
            result = original(*args, **kwargs)
            if not all(torch.isfinite(p).all() for group in optimizer.param_groups for p in group["params"]):
                _restore(optimizer, saved)
                self.stats["restored_steps"] += 1
                log.warning("rlaccel: a step made the weights non-finite; restored the last good weights "
                            "(%d restored so far)", self.stats["restored_steps"])
            return result

        guarded_step.rlaccel_guard = self  # type: ignore[attr-defined]  # how rlaccel's step kernels find the check
        self._originals[id(optimizer)] = (optimizer, original)
        optimizer.step = guarded_step  # type: ignore[method-assign]

    def add_counts(self, counts: torch.Tensor) -> None:
        """Add counters kept off the host (a CUDA graph's, a compiled step's) to ``stats``, and zero them:
        ``counts`` holds guarded, skipped and clipped steps (one read of the tensor)."""
        guarded, skipped, clipped = (int(v) for v in counts.tolist())
        counts.zero_()
        self.stats["guarded_steps"] += guarded
        self.stats["skipped_steps"] += skipped
        self.stats["clipped_steps"] += clipped
        if skipped:
            log.warning("rlaccel: skipped %d optimizer steps with a non-finite gradient norm; %d skipped so far",
                        skipped, self.stats["skipped_steps"])

    def wraps_class_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this guard's wrapper of ``optimizer.step`` calls the optimizer class's own ``step``."""
        original = self._originals.get(id(optimizer), (None, None))[1]
        return getattr(original, "__self__", None) is optimizer \
            and getattr(original, "__func__", None) is type(optimizer).step

    def detach(self) -> None:
        for optimizer, _ in self._originals.values():
            optimizer.__dict__.pop("step", None)  # back to the class's own step
        self._originals.clear()

    def allows_step(self, optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor | None = None) -> bool:
        """The check before a step: clip, count, and False where the step must be skipped (non-finite).
        ``grad_norm``: the gradients' total norm where the caller has it (rlaccel's flat optimizer step
        takes it from its flat gradient buffer in one op), read when there is no clipping."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return True
        self.stats["guarded_steps"] += 1
        limit = self.max_grad_norm if self.max_grad_norm is not None else math.inf
        if self.max_grad_norm is None:  # the norm only: scaling every gradient by 1.0 changes nothing
            norm = float(grad_norm if grad_norm is not None else total_norm([p.grad for p in params]))
        else:
            norm = float(clip_grad_norm(params, limit))
        finite = math.isfinite(norm)
        if self.loss_scaler is not None:
            self.loss_scaler.update(finite)
            self.stats["loss_scale"] = self.loss_scaler.scale
        if self.skip_nonfinite and not finite:
            for p in params:
                p.grad = None
            self.stats["skipped_steps"] += 1
            # with fp16 an overflow now and then is how the loss scale finds its level, not a fault
            log.log(logging.DEBUG if self.loss_scaler is not None else logging.WARNING,
                    "rlaccel: skipped an optimizer step with a non-finite gradient norm (%s); %d skipped so far",
                    norm, self.stats["skipped_steps"])
            return False
        if norm > limit:
            self.stats["clipped_steps"] += 1
        return True


def _snapshot(optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], dict]:
    import copy

    params = [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]
    return params, copy.deepcopy(optimizer.state_dict())


def _restore(optimizer: torch.optim.Optimizer, saved: tuple[list[torch.Tensor], dict]) -> None:
    params, state = saved
    with torch.no_grad():
        for p, old in zip((p for group in optimizer.param_groups for p in group["params"]), params):
            p.copy_(old)
    optimizer.load_state_dict(state)
