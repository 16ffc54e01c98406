"""Adam's and RMSprop's multi-tensor steps on the CPU as one op per stage over flat buffers: the same
bits, fewer kernels.

On the CPU, PyTorch's multi-tensor (``foreach``) optimizers have no multi-tensor kernels: each stage of
Adam's step (lerp, mul, addcmul, sqrt, div, add, addcdiv) or RMSprop's (mul, addcmul, sqrt, add,
addcdiv) loops over the parameter tensors, one kernel call of a few µs each, so a 3-layer MLP's 8
tensors cost about 50 calls per Adam step — more than the arithmetic of an RL-sized network. The stages
are elementwise: each element is computed alone, from the same inputs, by the same kernel, so running
each stage once over a buffer that holds every parameter's moments gives the same bits
(``tests/equivalence/test_flat_optim.py`` compares every parameter and state tensor with PyTorch's own step, bit for
bit, over many steps, with weight decay, AdamW, RMSprop, parameters that skip steps, state loaded from a
checkpoint).

:func:`optimizer_step` is ``optimizer.step()``: for an ``Adam`` / ``AdamW`` (no ``amsgrad``) or an
``RMSprop`` (no ``momentum``, not ``centered``: SB3's A2C) of CPU float32 parameters with the default
options otherwise (no ``maximize``, ``capturable``, ``differentiable``, float hyper-parameters, no step
pre-hooks, stepped by rlaccel's gradient guard or by nothing else) it runs the flat step, and otherwise
``optimizer.step()`` itself. The optimizer's ``state`` holds views of the flat buffers, so
``state_dict``, ``load_state_dict`` and checkpoints see the tensors they always see; state loaded from
elsewhere is copied into the buffers on the next step. Post-step hooks run as PyTorch runs them.

Examples:
    >>> import copy, torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> twin = copy.deepcopy(net)
    >>> ours, theirs = torch.optim.Adam(net.parameters(), foreach=True), torch.optim.Adam(twin.parameters(), foreach=True)
    >>> x = torch.randn(16, 4)
    >>> for _ in range(3):
    ...     for model, optimizer in ((net, ours), (twin, theirs)):
    ...         optimizer.zero_grad(); model(x).square().mean().backward()
    ...     optimizer_step(ours); theirs.step()
    >>> all(torch.equal(a, b) for a, b in zip(net.parameters(), twin.parameters()))
    True
"""

from __future__ import annotations

import contextlib
import weakref
from itertools import chain

import torch
from torch.optim import optimizer as torch_optimizer

# the optimizer state each kind keeps per parameter, besides its step count, in the order it makes it
_MOMENTS = {torch.optim.Adam: ("exp_avg", "exp_avg_sq"), torch.optim.AdamW: ("exp_avg", "exp_avg_sq"),
            torch.optim.RMSprop: ("square_avg",)}
_NUMBERS = (int, float)
_FLOAT32, _STRIDED = torch.float32, torch.strided
_ONE = torch.tensor(1.0)  # PyTorch's increment of CPU step counts, made once
_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> {group index: _Layout}


_enabled = True


@contextlib.contextmanager
def plain_steps():
    """Within it, :func:`optimizer_step` is ``optimizer.step()`` for every optimizer: how a benchmark
    times the flat step against PyTorch's own in one process."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``, as flat ops where this module covers the optimizer (see the module's docstring)."""
    guard = _plain_step_or_guard(optimizer)
    if guard is False or not _enabled or not _covered(optimizer):
        optimizer.step()
        return
    with torch.no_grad():
        gathered = []
        if guard is not None:
            # the guard's finiteness check reads the norm of the flat gradient buffer (one op); a guard
            # that clips rewrites the gradients, so they are gathered after it
            gathered = [_gather(optimizer, index, group) for index, group in enumerate(optimizer.param_groups)] \
                if guard.max_grad_norm is None else []
            if not guard.allows_step(optimizer, grad_norm=_norm_of(gathered)):
                return
        for index, group in enumerate(optimizer.param_groups):
            _step_group(optimizer, index, group, gathered[index] if gathered else None)
    for hook in chain(optimizer._optimizer_step_post_hooks.values(),
                      torch_optimizer._global_optimizer_post_hooks.values()):
        hook(optimizer, (optimizer,), {})


def _plain_step_or_guard(optimizer: torch.optim.Optimizer):
    """None when ``optimizer.step`` is its class's own; the gradient guard whose check wraps the class's
    step, with nothing else around it; False for any other wrapper (an LR scheduler's, a user's)."""
    step = optimizer.__dict__.get("step")
    if step is None:
        return None
    guard = getattr(step, "rlaccel_guard", None)
    if guard is None or guard.restore_last_good or not guard.wraps_class_step(optimizer):
        return False
    return guard


def _covered(optimizer: torch.optim.Optimizer) -> bool:
    kind = type(optimizer)
    if kind not in _MOMENTS or optimizer._optimizer_step_pre_hooks or torch_optimizer._global_optimizer_pre_hooks:
        return False
    for group in optimizer.param_groups:
        if group["maximize"] or group["capturable"] or group.get("fused") or group["differentiable"] \
                or group["foreach"] is False or not _numbers(group, "lr", "eps", "weight_decay"):
            return False
        if kind is torch.optim.RMSprop:
            if group["momentum"] != 0 or group["centered"] or not _numbers(group, "alpha", "momentum"):
                return False
        elif group["amsgrad"] or type(group["betas"][0]) not in _NUMBERS or type(group["betas"][1]) not in _NUMBERS:
            return False
        for p in group["params"]:
            grad = p.grad
            if p.dtype is not _FLOAT32 or not p.is_cpu or not p.is_contiguous() or (
                    grad is not None and (grad.dtype is not _FLOAT32 or grad.layout is not _STRIDED)):
                return False
    return True


def _numbers(group: dict, *keys: str) -> bool:
    return all(type(group[key]) in _NUMBERS for key in keys)


class _Layout:
    """A parameter group's per-parameter state (``moments``: Adam's two, RMSprop's one) in flat buffers,
    in the group's order (``state`` holds views of them), and two more for the gradients and the
    denominator, each with its per-parameter views."""

    def __init__(self, params: list[torch.Tensor], moments: tuple[str, ...]) -> None:
        self.params = list(params)
        self.names = moments
        self.sizes = [p.numel() for p in params]
        self.offsets = [0]
        for size in self.sizes:
            self.offsets.append(self.offsets[-1] + size)
        self.moments = {name: torch.zeros(self.offsets[-1]) for name in moments}
        self.grad, self.denom = torch.zeros(self.offsets[-1]), torch.zeros(self.offsets[-1])
        self.grad_views, self.denom_views = self._views(self.grad), self._views(self.denom)
        self.moment_views: list[tuple[torch.Tensor, ...] | None] = [None] * len(params)

    def _views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return [buffer[start:stop].view(p.shape) for p, start, stop in zip(self.params, self.offsets, self.offsets[1:])]

    def matches(self, params: list[torch.Tensor]) -> bool:
        return len(params) == len(self.params) and all(
            p is q and p.numel() == size for p, q, size in zip(params, self.params, self.sizes))

    def bind(self, optimizer: torch.optim.Optimizer, i: int) -> dict:
        """``optimizer.state[param]``'s moments as views of the buffers (the optimizer's zeros for a new state)."""
        p, state = self.params[i], optimizer.state[self.params[i]]
        start, stop = self.offsets[i], self.offsets[i + 1]
        views = tuple(self.moments[name][start:stop].view(p.shape) for name in self.names)
        if len(state) == 0:  # what Adam's and RMSprop's _init_group put there, in their order
            state["step"] = torch.zeros((), dtype=torch_optimizer._get_scalar_dtype())
            for view in views:
                view.zero_()
        else:
            for name, view in zip(self.names, views):
                view.copy_(state[name])
        for name, view in zip(self.names, views):
            state[name] = view
        self.moment_views[i] = views
        return state

    def bound(self, state: dict | None, i: int) -> bool:
        """Whether ``state`` holds this layout's views of parameter ``i`` (not new, not loaded from elsewhere)."""
        views = self.moment_views[i]
        return state is not None and views is not None and all(
            state.get(name) is view for name, view in zip(self.names, views))


def _layout(optimizer: torch.optim.Optimizer, index: int, params: list[torch.Tensor]) -> _Layout:
    layouts = _LAYOUTS.setdefault(optimizer, {})
    layout = layouts.get(index)
    if layout is None or not layout.matches(params):
        layout = layouts[index] = _Layout(params, _MOMENTS[type(optimizer)])
    return layout


def _gather(optimizer: torch.optim.Optimizer, index: int, group: dict) -> tuple[_Layout, list[int]] | None:
    """The group's gradients copied into its flat buffer: its layout and the indices of the parameters
    that have one (None where none has)."""
    params = group["params"]
    stepped = [i for i, p in enumerate(params) if p.grad is not None]
    if not stepped:
        return None
    layout = _layout(optimizer, index, params)
    torch._foreach_copy_([layout.grad_views[i] for i in stepped], [params[i].grad for i in stepped])
    return layout, stepped


def _norm_of(gathered: list[tuple[_Layout, list[int]] | None]) -> torch.Tensor | None:
    """The gradients' total norm from the flat buffers, where every parameter has a gradient (the buffer
    then holds exactly them); None otherwise."""
    norms = []
    for entry in gathered:
        if entry is None or len(entry[1]) != len(entry[0].params):
            return None
        norms.append(torch.linalg.vector_norm(entry[0].grad))
    if not norms:
        return None
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


def _step_group(optimizer: torch.optim.Optimizer, index: int, group: dict,
                gathered: tuple[_Layout, list[int]] | None = None) -> None:
    params = group["params"]
    if gathered is None:
        gathered = _gather(optimizer, index, group)
        if gathered is None:
            return
    layout, stepped = gathered
    steps = []
    for i in stepped:
        state = optimizer.state.get(params[i])
        if not layout.bound(state, i):  # new, or loaded from elsewhere
            state = layout.bind(optimizer, i)
        steps.append(state["step"])  # type: ignore[index]  # bound or just bound
    torch._foreach_add_(steps, _ONE, alpha=1.0)  # as PyTorch increments CPU step counts
    lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
    if type(optimizer) is torch.optim.RMSprop:  # no bias correction: one run over every stepped parameter
        for run in _runs(stepped, [0.0] * len(stepped)):
            _rmsprop_run(layout, params, run, lr, group["alpha"], eps, weight_decay)
        return
    counts = [step.item() for step in steps]
    beta1, beta2 = group["betas"]
    decoupled = group.get("decoupled_weight_decay", False)
    if weight_decay != 0 and decoupled:  # AdamW
        torch._foreach_mul_([params[i] for i in stepped], 1 - lr * weight_decay)
    start = 0
    for run in _runs(stepped, counts):
        _step_run(layout, params, run, counts[start], lr, beta1, beta2, eps, 0.0 if decoupled else weight_decay)
        start += len(run)


def _runs(stepped: list[int], counts: list[float]) -> list[list[int]]:
    """``stepped`` split where the indices leave a gap or the step counts differ (each run: one bias correction)."""
    if stepped[-1] - stepped[0] == len(stepped) - 1 and counts.count(counts[0]) == len(counts):
        return [stepped]  # the usual case: one run
    runs = [[stepped[0]]]
    for k in range(1, len(stepped)):
        if stepped[k] == stepped[k - 1] + 1 and counts[k] == counts[k - 1]:
            runs[-1].append(stepped[k])
        else:
            runs.append([stepped[k]])
    return runs


def _step_run(layout: _Layout, params: list[torch.Tensor], run: list[int], count: float, lr: float,
              beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """PyTorch's ``_multi_tensor_adam`` stages for the parameters ``run`` (adjacent in the buffers)."""
    first, last = run[0], run[-1] + 1
    start, stop = layout.offsets[first], layout.offsets[last]
    members = params[first:last]
    grad = _decayed_gradient(layout, members, first, last, weight_decay)
    exp_avg, exp_avg_sq = layout.moments["exp_avg"][start:stop], layout.moments["exp_avg_sq"][start:stop]
    denom = layout.denom[start:stop]
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2)
    exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
    step_size = (lr / (1 - beta1 ** count)) * -1
    torch.sqrt(exp_avg_sq, out=denom)
    denom.div_((1 - beta2 ** count) ** 0.5)
    denom.add_(eps)
    torch._foreach_addcdiv_(members, [views[0] for views in layout.moment_views[first:last]],  # type: ignore[index]
                            layout.denom_views[first:last], step_size)


def _rmsprop_run(layout: _Layout, params: list[torch.Tensor], run: list[int], lr: float, alpha: float, eps: float,
                 weight_decay: float) -> None:
    """PyTorch's ``_multi_tensor_rmsprop`` stages (no momentum, not centered) for the parameters ``run``."""
    first, last = run[0], run[-1] + 1
    start, stop = layout.offsets[first], layout.offsets[last]
    members = params[first:last]
    grad = _decayed_gradient(layout, members, first, last, weight_decay)
    square_avg, avg = layout.moments["square_avg"][start:stop], layout.denom[start:stop]
    square_avg.mul_(alpha)
    square_avg.addcmul_(grad, grad, value=1 - alpha)
    torch.sqrt(square_avg, out=avg)
    avg.add_(eps)
    if weight_decay == 0:
        grads = layout.grad_views[first:last]
    else:  # the decayed gradient is a new tensor: its per-parameter pieces
        grads = [g.view(p.shape) for g, p in zip(grad.split(layout.sizes[first:last]), members)]
    torch._foreach_addcdiv_(members, grads, layout.denom_views[first:last], value=-lr)


def _decayed_gradient(layout: _Layout, members: list[torch.Tensor], first: int, last: int,
                      weight_decay: float) -> torch.Tensor:
    """The run's gathered gradient; with an L2 term, a new tensor ``grad + weight_decay * param`` (as PyTorch's)."""
    start, stop = layout.offsets[first], layout.offsets[last]
    grad = layout.grad[start:stop]  # gathered by _gather
    if weight_decay != 0:
        torch._foreach_copy_(layout.denom_views[first:last], members)
        grad = torch.add(grad, layout.denom[start:stop], alpha=weight_decay)
    return grad
