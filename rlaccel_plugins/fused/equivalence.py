"""The equivalence harness: what a fused update must reproduce of the framework's own, step by step.

:class:`UpdateRecorder` records, while active, every scalar loss that ``backward()`` receives (through
``loss.backward()`` or ``torch.autograd.backward([...])``, in order) and,
for each optimizer step, the gradients it applies; :func:`differences` compares two recordings, or
two states (parameters, optimizer states, target networks), within a float tolerance. Run the stock
and the fused update from the same model, seed and buffer contents under a recorder each, then
compare the records and the final states.

Examples:
    >>> import torch
    >>> net = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    >>> with UpdateRecorder([optimizer]) as record:
    ...     net(torch.ones(1, 2)).sum().backward()
    ...     optimizer.step()
    >>> len(record.losses), len(record.gradients)
    (1, 1)
    >>> differences(record.gradients, record.gradients)
    []
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch


class UpdateRecorder:
    """Records the losses backpropagated and the gradients each optimizer step applies."""

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        self.losses: list[torch.Tensor] = []
        self.gradients: list[list[torch.Tensor | None]] = []
        self._handles: list[Any] = []
        self._backward: Any = None

    def __enter__(self) -> UpdateRecorder:  # noqa: PYI034 - typing.Self needs Python 3.11
        # torch.autograd.backward: what Tensor.backward calls, and what a fused update calls with several
        # losses at once (each recorded, in order); Tensor.backward itself stays torch's own
        original = self._backward = torch.autograd.backward
        losses = self.losses

        def recording_backward(tensors: Any, *args: Any, **kwargs: Any):
            for tensor in [tensors] if torch.is_tensor(tensors) else tensors:
                if tensor.numel() == 1:
                    losses.append(tensor.detach().clone())
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = recording_backward  # type: ignore[assignment]
        for optimizer in self.optimizers:
            self._handles.append(optimizer.register_step_pre_hook(self._record_gradients))
        return self

    def _record_gradients(self, optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        self.gradients.append([None if p.grad is None else p.grad.detach().clone()
                               for group in optimizer.param_groups for p in group["params"]])

    def __exit__(self, *exc: object) -> None:
        torch.autograd.backward = self._backward
        for handle in self._handles:
            handle.remove()
        self._handles = []


def differences(expected: Any, actual: Any, *, rtol: float = 0.0, atol: float = 0.0, place: str = "") -> list[str]:
    """Where ``actual`` differs from ``expected`` beyond ``atol + rtol * |expected|``: tensors, arrays and
    numbers compared elementwise, dicts by key, sequences by position; ``[]`` when they agree."""
    if isinstance(expected, np.ndarray) and isinstance(actual, np.ndarray):
        expected, actual = torch.from_numpy(expected), torch.from_numpy(actual)
    if torch.is_tensor(expected) or torch.is_tensor(actual):
        if not (torch.is_tensor(expected) and torch.is_tensor(actual)):
            return [f"{place or 'value'}: {type(expected).__name__} vs {type(actual).__name__}"]
        if expected.shape != actual.shape or expected.dtype != actual.dtype:
            return [f"{place or 'value'}: {expected.dtype}{tuple(expected.shape)} vs {actual.dtype}{tuple(actual.shape)}"]
        e, a = expected.detach().cpu(), actual.detach().cpu()
        if e.is_floating_point():
            close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = a == e
        if bool(close.all()):
            return []
        gap = (a.double() - e.double()).abs().max().item()
        return [f"{place or 'value'}: {int((~close).sum())} of {close.numel()} elements differ (max |diff| {gap:.3g})"]
    if isinstance(expected, dict) and isinstance(actual, dict):
        if expected.keys() != actual.keys():
            return [f"{place or 'value'}: keys {sorted(map(str, expected))} vs {sorted(map(str, actual))}"]
        return [d for key in expected
                for d in differences(expected[key], actual[key], rtol=rtol, atol=atol, place=f"{place}[{key!r}]")]
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            return [f"{place or 'value'}: {len(expected)} vs {len(actual)} items"]
        return [d for i, (e, a) in enumerate(zip(expected, actual))
                for d in differences(e, a, rtol=rtol, atol=atol, place=f"{place}[{i}]")]
    if isinstance(expected, (float, np.floating)) and isinstance(actual, (float, np.floating)):
        expected, actual = float(expected), float(actual)
        same = actual == expected or (math.isnan(actual) and math.isnan(expected))  # as tensors: inf and NaN match
        return [] if same or abs(actual - expected) <= atol + rtol * abs(expected) else [f"{place}: {expected!r} vs {actual!r}"]
    return [] if expected == actual else [f"{place or 'value'}: {expected!r} vs {actual!r}"]
