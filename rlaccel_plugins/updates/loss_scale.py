"""Dynamic loss scaling for fp16 updates inside frameworks that call ``backward()`` themselves.

fp16 gradients underflow below ~6e-8, so the loss is multiplied by a large scale before
``backward()`` and the gradients divided by it again. ``torch.amp.GradScaler`` expects to wrap the
loss, the unscale and the step at the call site; SB3's ``train()`` and Tianshou's
``Optimizer.step()`` do ``loss.backward()``, *clip* and ``step()`` themselves, so their clipping
would see scaled gradients. :class:`LossScaler` therefore scales inside ``Tensor.backward`` (while
:meth:`LossScaler.scaling` is active) and unscales each leaf's gradient *before* it is accumulated
into ``.grad`` (a one-shot hook per leaf of that backward), so the framework's clipping and
optimizer see true fp32 gradients. The scale follows ``GradScaler``'s defaults: start at 2**16,
halve on a non-finite step (which the :class:`~rlaccel_plugins.updates.guard.GradientGuard` skips),
double after 2,000 finite steps in a row.

Examples:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([1e-4]))
    >>> scaler = LossScaler()
    >>> with scaler.scaling():
    ...     (w * 2.0).sum().backward()
    >>> w.grad                      # scaled by 65536 on the way, unscaled before it landed
    tensor([2.])
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class LossScaler:
    """The loss scale of fp16 updates, and the ``backward()`` that applies it."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self._good_steps = 0

    def update(self, finite: bool) -> None:
        """After an optimizer step: back off on overflow, grow after ``growth_interval`` clean steps."""
        if not finite:
            self.scale *= self.backoff_factor
            self._good_steps = 0
            return
        self._good_steps += 1
        if self._good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self._good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self._good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self._good_steps = float(state["scale"]), int(state["good_steps"])

    @contextlib.contextmanager
    def scaling(self) -> Iterator[LossScaler]:
        """While active, ``loss.backward()`` of a scalar loss backpropagates ``loss * scale`` and each
        leaf receives its gradient divided by ``scale``. Patches ``torch.Tensor.backward`` for the
        duration: the frameworks' update code calls it directly and offers no other place."""
        original = torch.Tensor.backward
        scaler = self

        def scaled_backward(tensor: torch.Tensor, gradient=None, *args, **kwargs):
            if gradient is not None or tensor.numel() != 1 or tensor.grad_fn is None:
                return original(tensor, gradient, *args, **kwargs)
            scale = scaler.scale
            handles = [leaf.register_hook(lambda grad: grad / scale) for leaf in _leaves(tensor)]
            try:
                return original(tensor * scale, None, *args, **kwargs)
            finally:
                for handle in handles:
                    handle.remove()

        torch.Tensor.backward = scaled_backward  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            torch.Tensor.backward = original  # type: ignore[method-assign]


def _leaves(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors whose ``.grad`` a backward from ``tensor`` writes (its AccumulateGrad nodes)."""
    leaves, seen, stack = [], set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            leaves.append(variable)
        stack.extend(child for child, _ in node.next_functions)
    return leaves
