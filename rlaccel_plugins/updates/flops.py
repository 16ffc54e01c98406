"""Measured FLOPs of a forward pass and of full vs dense backward passes (`FlopCounterMode`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from rlaccel_plugins.updates.layers import forward_outputs, side_effect_free, tensors_in


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one gradient step on the traced input: forward, backward when full, backward when dense."""

    forward: int
    backward_full: int
    backward_dense: int


def measure_step_flops(module: nn.Module, example_input: Any, forward_fn: Callable | None,
                       frozen: list[nn.Parameter]) -> StepFlops:
    """Count forward and backward FLOPs with everything trainable, then with ``frozen`` frozen."""

    def backward_flops() -> tuple[int, int]:
        with FlopCounterMode(display=False) as fwd:
            outputs = forward_outputs(module, example_input, forward_fn)
        loss = sum(t.float().sum() for t in tensors_in(outputs) if t.requires_grad)
        if not isinstance(loss, torch.Tensor):
            return fwd.get_total_flops(), 0
        with FlopCounterMode(display=False) as bwd:
            loss.backward()
        return fwd.get_total_flops(), bwd.get_total_flops()

    with side_effect_free(module):
        forward, full = backward_flops()
        flags = [p.requires_grad for p in frozen]
        try:
            for p in frozen:
                p.requires_grad_(False)
            _, dense = backward_flops()
        finally:
            for p, flag in zip(frozen, flags):
                p.requires_grad_(flag)
    return StepFlops(forward=forward, backward_full=full, backward_dense=dense)
