"""One training step as a CUDA graph, replayed with new inputs (LeanRL's recipe, framework-neutral).

A gradient step of an MLP or a small CNN launches a few hundred kernels; on a GPU each launch costs
more than its arithmetic. Captured once in a ``torch.cuda.CUDAGraph``, the whole step (forward,
backward, clipping, optimizer) replays as one launch. What the adapters give :class:`StepGraphs` is a
function of tensors doing one step and returning tensors; a graph is captured per **key** — whatever
changes the captured work: the sparse/dense phase (which parameters get gradients), the learning rates,
the input shapes, a host-side branch such as "Polyak update this step" — after ``warmup`` eager steps
of that key (real steps: they also create the optimizer's state before capture).

What a replay does not run is Python: so in graph mode

- the optimizers' step hooks (the sparse/dense schedule's counter) are lifted off the optimizers and
  fired by :meth:`StepGraphs.run` after every step instead;
- the gradient guard's check runs on the device: the total gradient norm, clipping, and a non-finite
  norm skips the step inside the fused optimizer (its ``found_inf``, as AMP's ``GradScaler`` does) —
  no host sync per step; its counters are added up on the device and read once per :meth:`flush`;
- optimizers run their ``fused=True, capturable=True`` kernels (the step count on the device).

Off CUDA, or with ``enabled=False``, :meth:`StepGraphs.run` calls the step function directly and
:meth:`StepGraphs.optimizer_step` is ``optimizer.step()``: the same code path, eager.

Examples:
    >>> import torch
    >>> net = torch.nn.Linear(3, 1)
    >>> optimizer = torch.optim.Adam(net.parameters())
    >>> def step(x, y):
    ...     optimizer.zero_grad()
    ...     loss = torch.nn.functional.mse_loss(net(x), y)
    ...     loss.backward()
    ...     graphs.optimizer_step(optimizer)
    ...     return (loss.detach(),)
    >>> with StepGraphs(step, [optimizer], enabled=False) as graphs:  # True on a CUDA device
    ...     (loss,) = graphs.run("full", (torch.ones(4, 3), torch.zeros(4, 1)))
    >>> graphs.captured
    0
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from rlaccel_plugins.fused import flat_optim
from rlaccel_plugins.fused.kernels import OptimizerKernels, clip_grad_norm, total_norm

log = logging.getLogger("rlaccel")

GRAPHABLE = (torch.optim.Adam, torch.optim.AdamW)  # fused + capturable + found_inf


def graphs_possible(optimizers: Sequence[torch.optim.Optimizer], guard: Any = None) -> str | None:
    """Why these optimizers (and guard) cannot be captured, or None when they can."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    for optimizer in optimizers:
        if any(g.get("foreach") or g.get("fused") or g.get("differentiable") for g in optimizer.param_groups):
            return "an optimizer with its own kernel choice (foreach/fused/differentiable set)"
        if type(optimizer) not in GRAPHABLE:
            return f"{type(optimizer).__name__} has no fused capturable kernel (Adam, AdamW have)"
        if any(p.device.type != "cuda" for g in optimizer.param_groups for p in g["params"]):
            return "parameters not on a CUDA device"
        if optimizer._optimizer_step_pre_hooks:
            return "an optimizer step pre-hook (it would see the gradients after the step)"
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    if _global_optimizer_pre_hooks or _global_optimizer_post_hooks:
        return "a global optimizer hook"
    if guard is not None and (guard.loss_scaler is not None or guard.restore_last_good):
        return "the guard's fp16 loss scaling / restore_last_good need the host"
    return None


class StepGraphs:
    """Run ``step(*inputs) -> tuple[Tensor, ...]`` per key as a captured CUDA graph (``enabled``) or eagerly.

    Inputs that are not tensors are constants baked into the graph: the key must hold their values.
    Use as a context manager (or :meth:`apply` / :meth:`restore`): in graph mode it switches the
    optimizers to fused, capturable kernels and lifts their step hooks, and puts both back.

    Args:
        step: one gradient step; calls :meth:`optimizer_step` instead of ``optimizer.step()``.
        optimizers: every optimizer the step steps.
        enabled: capture graphs (needs :func:`graphs_possible` to be None).
        guard: the :class:`~rlaccel_plugins.updates.guard.GradientGuard` attached to the optimizers, if any.
        warmup: eager steps per key before its capture.
        max_graphs: keys beyond this many (a learning-rate schedule changing every call) run eagerly.
    """

    def __init__(self, step: Callable[..., tuple[torch.Tensor, ...]], optimizers: Sequence[torch.optim.Optimizer],
                 *, enabled: bool, guard: Any = None, warmup: int = 2, max_graphs: int = 8) -> None:
        self.step, self.optimizers, self.enabled, self.guard = step, list(optimizers), enabled, guard
        self.warmup, self.max_graphs = max(1, warmup), max_graphs  # warm-up creates the optimizer state
        # key -> (graph, static inputs, static outputs, the optimizers it steps)
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, tuple, tuple, list]] = {}
        self._seen: dict[Hashable, int] = {}
        self._kernels: OptimizerKernels | None = None
        self._lifted: list[tuple[torch.optim.Optimizer, Any]] = []
        self._counts: torch.Tensor | None = None  # guard counters on the device: guarded, skipped, clipped
        self._stepped: list[torch.optim.Optimizer] = []  # the optimizers the step being recorded stepped

    @property
    def captured(self) -> int:
        """How many graphs are captured."""
        return len(self._graphs)

    # ------------------------------------------------------------------ install / remove
    def apply(self) -> StepGraphs:
        if not self.enabled or self._kernels is not None:
            return self
        self._kernels = OptimizerKernels(self.optimizers, fused=True, capturable=True).apply()
        for optimizer in self.optimizers:
            self._lifted.append((optimizer, optimizer._optimizer_step_post_hooks))
            optimizer._optimizer_step_post_hooks = OrderedDict()
            optimizer._warned_capturable_if_run_uncaptured = True  # the warm-up steps run uncaptured on purpose
        return self

    def restore(self) -> None:
        """Flush the guard's counters, drop the graphs, put the hooks and the optimizers' kernels back."""
        self.flush()
        self._graphs.clear()
        self._seen.clear()
        for optimizer, hooks in self._lifted:
            hooks.update(optimizer._optimizer_step_post_hooks)  # hooks registered meanwhile stay
            optimizer._optimizer_step_post_hooks = hooks
        self._lifted = []
        if self._kernels is not None:
            self._kernels.restore()
            self._kernels = None

    def __enter__(self) -> StepGraphs:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self.apply()

    def __exit__(self, *exc) -> None:
        self.restore()

    # ------------------------------------------------------------------ running
    def run(self, key: Hashable, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """One step with ``inputs`` under ``key``: eager, warm-up, capture-then-replay, or replay."""
        if not self.enabled:
            return self.step(*inputs)
        graph = self._graphs.get(key)
        if graph is None:
            seen = self._seen.get(key, 0)
            self._seen[key] = seen + 1
            if seen < self.warmup or len(self._graphs) >= self.max_graphs:
                self._stepped = []
                outputs = self._on_side_stream(inputs)
                self._fire_post_hooks(self._stepped)
                return outputs
            graph = self._capture(key, inputs)
        g, static_inputs, outputs, stepped = graph
        for static, value in zip(static_inputs, inputs):
            if torch.is_tensor(static):
                static.copy_(value, non_blocking=True)
        g.replay()
        self._fire_post_hooks(stepped)
        return tuple(o.clone() for o in outputs)  # the graph's own are overwritten by the next replay

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` eagerly (flat Adam on the CPU, :mod:`~rlaccel_plugins.fused.flat_optim`); in graph
        mode the class's step with the guard's check on the device."""
        if not self.enabled:
            flat_optim.optimizer_step(optimizer)
            return
        self._stepped.append(optimizer)
        found_inf = self._device_guard(optimizer) if self.guard is not None else None
        if found_inf is not None:
            optimizer.found_inf = found_inf  # type: ignore[attr-defined]  # read by the fused step kernels
        try:
            type(optimizer).step(optimizer)  # not an instance override (the host-side guard)
        finally:
            optimizer.__dict__.pop("found_inf", None)

    def flush(self) -> None:
        """Add the guard's device-side counters to its ``stats`` (one host sync)."""
        if self._counts is not None and self.guard is not None:
            self.guard.add_counts(self._counts)

    # ------------------------------------------------------------------ internals
    def _device_guard(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return None
        limit = self.guard.max_grad_norm
        norm = total_norm([p.grad for p in params]) if limit is None else clip_grad_norm(params, limit)
        found_inf = (~torch.isfinite(norm)).float() if self.guard.skip_nonfinite else torch.zeros_like(norm)
        clipped = (norm > limit).float() if limit is not None else torch.zeros_like(norm)
        if self._counts is None:
            self._counts = torch.zeros(3, device=norm.device)
        self._counts.add_(torch.stack([torch.ones_like(norm), found_inf, clipped * (1 - found_inf)]))
        return found_inf

    def _fire_post_hooks(self, stepped: list[torch.optim.Optimizer]) -> None:
        """The lifted step post-hooks of each optimizer the step stepped, in the step's order."""
        lifted = {id(optimizer): hooks for optimizer, hooks in self._lifted}
        for optimizer in stepped:
            for hook in list(lifted[id(optimizer)].values()):
                hook(optimizer, (), {})

    def _on_side_stream(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            outputs = self.step(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        return outputs

    def _capture(self, key: Hashable, inputs: Sequence[torch.Tensor]) -> tuple:
        static_inputs = tuple(value.clone() if torch.is_tensor(value) else value for value in inputs)
        graph = torch.cuda.CUDAGraph()
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)  # gradients are allocated in the graph's pool
        torch.cuda.synchronize()
        self._stepped = []
        validate = torch.distributions.Distribution._validate_args
        torch.distributions.Distribution.set_default_validate_args(False)  # its checks sync with the host
        try:
            with torch.cuda.graph(graph):
                outputs = self.step(*static_inputs)
        finally:
            torch.distributions.Distribution.set_default_validate_args(validate)
        self._graphs[key] = (graph, static_inputs, outputs, self._stepped)
        log.debug("rlaccel: captured a CUDA graph of the update for %r (%d so far)", key, len(self._graphs))
        # capturing recorded the step without running it: run() replays it now
        return self._graphs[key]
