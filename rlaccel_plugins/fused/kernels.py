"""Multi-tensor kernels for the steps a framework's update repeats: the optimizer step, the Polyak
(soft) target update, and the gradient norm (for clipping and the NaN/Inf guard).

All keep the framework's arithmetic: PyTorch's ``foreach`` Adam/AdamW/SGD/RMSprop compute exactly
what the per-parameter loop computes (bit for bit on CPU, tested), in one kernel launch per op for all
parameters instead of one per parameter; ``polyak_update_`` does SB3's ``mul_`` then ``add`` in the
same order; ``total_norm`` and ``clip_grad_norm`` run the ops of torch's ``get_total_norm`` and
``clip_grad_norm_``. ``fused=True`` optimizers (one kernel for the whole step) round differently, so they
are used only where asked for.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

MULTI_TENSOR = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.RMSprop)
_CPU = torch.device("cpu")


class OptimizerKernels:
    """Switch optimizers' parameter groups to their multi-tensor (``foreach``) implementation, or to
    ``fused`` with ``fused=True``, and back. Optimizers of other classes, or already set explicitly,
    are left alone.

    With ``capturable=True`` (CUDA-graph capture) the step counts move to the parameters' device too.
    Use as a context manager, or call :meth:`apply` / :meth:`restore` (idempotent).
    """

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer], fused: bool = False,
                 capturable: bool = False) -> None:
        self.optimizers = [o for o in optimizers if isinstance(o, MULTI_TENSOR)]
        self.fused, self.capturable = fused, capturable
        self._saved: list[tuple[torch.optim.Optimizer, dict, object, object, object]] = []

    def apply(self) -> OptimizerKernels:
        if self._saved:
            return self
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                if group.get("foreach") or group.get("fused") or group.get("differentiable"):
                    continue  # the user's explicit choice
                self._saved.append((optimizer, group, group.get("foreach"), group.get("fused"),
                                    group.get("capturable")))
                if self.fused and "fused" in group:
                    group["foreach"], group["fused"] = False, True
                else:
                    group["foreach"] = True
                if self.capturable and "capturable" in group:
                    group["capturable"] = True
                if self.fused or self.capturable:  # foreach alone keeps the step counts where they are
                    _move_steps(optimizer, group)
        return self

    def restore(self) -> None:
        for optimizer, group, foreach, fused, capturable in self._saved:
            group["foreach"] = foreach
            for key, value in (("fused", fused), ("capturable", capturable)):
                if key in group:
                    group[key] = value
            if self.fused or self.capturable:
                _move_steps(optimizer, group)
        self._saved = []

    def __enter__(self) -> OptimizerKernels:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self.apply()

    def __exit__(self, *exc) -> None:
        self.restore()


def _move_steps(optimizer: torch.optim.Optimizer, group: dict) -> None:
    """Fused and capturable kernels keep the step count on the parameter's device; the loop on the CPU."""
    on_device = group.get("fused") or group.get("capturable")
    for p in group["params"]:
        step = optimizer.state.get(p, {}).get("step")
        device = p.device if on_device else _CPU
        if torch.is_tensor(step) and step.device != device:  # on the CPU nothing moves: no .to() per update
            optimizer.state[p]["step"] = step.to(device)


@torch.no_grad()
def polyak_update_(params: list[torch.Tensor], target_params: list[torch.Tensor], tau: float, *,
                   weighted_sum: bool = False) -> None:
    """``target = (1 - tau) * target + tau * param`` for every pair, in multi-tensor ops.

    The rounding is SB3's ``polyak_update`` (``mul_(1 - tau)`` then ``add(..., alpha=tau)``), or with
    ``weighted_sum=True`` that of ``tau * param + (1 - tau) * target`` with both products rounded
    first (Tianshou's ``polyak_parameter_update``).
    """
    if len(params) != len(target_params):
        raise ValueError(f"params and target_params must pair up, got {len(params)} and {len(target_params)} tensors")
    if not params:
        return
    if weighted_sum:
        scaled = torch._foreach_mul(params, tau)
        torch._foreach_mul_(target_params, 1 - tau)
        torch._foreach_add_(target_params, scaled)
        return
    torch._foreach_mul_(target_params, 1 - tau)
    torch._foreach_add_(target_params, params, alpha=tau)


def zero_grad(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad()`` (``set_to_none=True``, its default): every gradient set to None, without
    the call's ``torch._disable_dynamo`` wrapper and profiler label (three calls per TD3/SAC update).
    An optimizer whose class or instance has its own ``zero_grad``, or a call while the
    autograd profiler runs (so that traces keep the label), gets the optimizer's own.

    Examples:
        >>> w = torch.nn.Parameter(torch.ones(2)); w.grad = torch.ones(2)
        >>> zero_grad(torch.optim.SGD([w], lr=0.1)); w.grad is None
        True
    """
    if type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad or "zero_grad" in optimizer.__dict__ \
            or torch.autograd.profiler._is_profiler_enabled:
        optimizer.zero_grad()
        return
    if not hasattr(optimizer, "_zero_grad_profile_name"):  # what zero_grad does on its first call
        optimizer._patch_step_function()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad = None


def backward_to(loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """``loss.backward()``, computing only the gradients ``optimizer`` applies: those of its parameters
    that require one. An actor's loss goes through the critic; the frameworks backpropagate it into the
    critic's weights too, leave that in their ``.grad`` and zero it before the critic's next step
    without ever applying it — a weight-gradient matmul per critic layer, ~10% of a SAC step's
    arithmetic. The optimizer's own parameters get the same gradients, bit for bit (autograd runs the
    same ops on every path to them); the other parameters' ``.grad`` is left as it was.

    Examples:
        >>> actor, critic = torch.nn.Linear(2, 1), torch.nn.Linear(1, 1)
        >>> optimizer = torch.optim.SGD(actor.parameters(), lr=0.1)
        >>> backward_to(-critic(actor(torch.ones(3, 2))).mean(), optimizer)
        >>> actor.weight.grad is not None, critic.weight.grad is None
        (True, True)
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if params:
        loss.backward(inputs=params)
    else:
        loss.backward()


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """``torch.nn.utils.get_total_norm(grads)``, the same ops and result, without its per-call grouping
    by device and dtype when there is one group (one network's gradients); timed by
    ``benchmarks/grad_norm_bench.py``.

    Examples:
        >>> grads = [torch.full((2, 2), 3.0), torch.full((3,), 4.0)]
        >>> torch.equal(total_norm(grads), torch.nn.utils.get_total_norm(grads))
        True
    """
    if not _one_group(grads):
        return torch.nn.utils.get_total_norm(grads, foreach=True)
    return _norm_of_one_group(grads)


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` (the same ops and result) without its
    per-call grouping where :func:`total_norm` skips it; returns the total norm. Parameters without a
    gradient are left out, as there.

    Examples:
        >>> w = torch.nn.Parameter(torch.ones(4)); w.grad = torch.full((4,), 2.0)
        >>> float(clip_grad_norm([w], 1.0)), w.grad.norm().item() <= 1.0
        (4.0, True)
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads or not _one_group(grads):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, foreach=True)
    norm = _norm_of_one_group(grads)
    torch._foreach_mul_(grads, torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0))
    return norm


def _norm_of_one_group(grads: list[torch.Tensor]) -> torch.Tensor:
    """``get_total_norm``'s ops for one device-and-dtype group: the per-tensor norms, then their norm."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


def _one_group(tensors: list[torch.Tensor]) -> bool:
    """All on one CPU or CUDA device, in one dtype: what torch's grouping would put in one group."""
    device, dtype = tensors[0].device, tensors[0].dtype
    return device.type in ("cpu", "cuda") and all(t.device == device and t.dtype == dtype for t in tensors)
