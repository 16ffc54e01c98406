"""Convolutions in channels-last memory format while training (``training.channels_last``, opt-in).

On the CPU, oneDNN runs a ``Conv2d`` faster on NHWC ("channels-last") tensors than on PyTorch's default
NCHW, most of all in the convolutions' backward at large batches (measured by
``benchmarks/investigations/cnn_step_bench.py``). The sums then run in another order, so
the results are not bit for bit the contiguous ones: an opt-in with a tolerance, as
``training.fused_optimizer`` is (``tests/equivalence/test_channels_last.py`` states it).

:class:`ChannelsLast` converts the weight of every ``Conv2d`` under the given modules (the same
``Parameter`` objects, their data replaced, so optimizers and references keep working; gradients and
optimizer state of those weights too) and gives each such layer its input in channels-last with a
forward pre-hook. Networks that preprocess their observations before the first convolution (SB3's
``preprocess_obs``: uint8 frames to float, divided by 255) can be named as ``frame_inputs``: their 4-D
input is converted instead, while it is still uint8 — a quarter of the bytes to copy — and the float
frames come out of the elementwise preprocessing already in channels-last, so the layer has nothing
left to convert (the same values reach it either way). :meth:`ChannelsLast.remove` puts every tensor
back in the format it had — the same values, bit for bit — and removes the hooks: a model saved after
training holds what it always holds.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU(), torch.nn.Flatten())
    >>> before = net[0].weight.detach().clone()
    >>> layout = ChannelsLast([net])
    >>> layout.layers, net[0].weight.is_contiguous(memory_format=torch.channels_last)
    (1, True)
    >>> net(torch.rand(2, 4, 6, 6)).shape
    torch.Size([2, 128])
    >>> layout.remove()
    >>> net[0].weight.is_contiguous(), torch.equal(net[0].weight, before)
    (True, True)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_CHANNELS_LAST = torch.channels_last


def _channels_last_input(_module: torch.nn.Module, args: tuple) -> tuple | None:
    """A batched 4-D input in channels-last (a ``Conv2d``'s output then stays in it)."""
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and not x.is_contiguous(memory_format=_CHANNELS_LAST):
        return (x.contiguous(memory_format=_CHANNELS_LAST), *args[1:])
    return None


class ChannelsLast:
    """The ``Conv2d`` layers under ``modules`` in channels-last until :meth:`remove` (see the module docstring).

    Args:
        modules: the networks (their submodules included; each layer once, however often it is reached).
        optimizers: optimizers whose state for those weights (Adam's moments) is converted along with them.
        frame_inputs: modules whose first argument, when a 4-D tensor, is handed over in channels-last
            before they run: only networks whose every op up to the first convolution leaves the memory
            format as it finds it (elementwise ops do; a ``view`` of the input would fail).
    """

    def __init__(self, modules: Iterable[torch.nn.Module],
                 optimizers: Iterable[torch.optim.Optimizer] = (),
                 frame_inputs: Iterable[torch.nn.Module] = ()) -> None:
        self._weights: list[torch.Tensor] = []  # converted from contiguous: put back on remove()
        self._hooks = []
        seen: set[int] = set()
        for root in modules:
            for module in root.modules():
                if type(module) is torch.nn.Conv2d and id(module) not in seen:
                    seen.add(id(module))
                    self._hooks.append(module.register_forward_pre_hook(_channels_last_input))
                    if _plain(module.weight):
                        self._weights.append(module.weight)
        self.layers = len(self._hooks)
        self._hooks += [module.register_forward_pre_hook(_channels_last_input) for module in frame_inputs]
        self._states = [optimizer.state for optimizer in optimizers]
        with torch.no_grad():
            for weight in self._weights:
                weight.data = weight.data.contiguous(memory_format=_CHANNELS_LAST)
        self._convert_gradients_and_state(_CHANNELS_LAST)

    def _convert_gradients_and_state(self, memory_format: torch.memory_format) -> None:
        """The converted weights' gradients and optimizer state (moments made while installed included)
        in ``memory_format``."""
        for weight in self._weights:
            if weight.grad is not None:
                weight.grad = weight.grad.contiguous(memory_format=memory_format)
            for state in self._states:
                entries = state.get(weight, {})
                for key, value in entries.items():
                    if isinstance(value, torch.Tensor) and value.shape == weight.shape:
                        entries[key] = value.contiguous(memory_format=memory_format)

    def remove(self) -> None:
        """Every converted tensor back in PyTorch's default format (the same values), the hooks removed;
        idempotent."""
        for hook in self._hooks:
            hook.remove()
        with torch.no_grad():
            for weight in self._weights:
                weight.data = weight.data.contiguous()
        self._convert_gradients_and_state(torch.contiguous_format)
        self._hooks, self._weights, self._states = [], [], []


def _plain(tensor: torch.Tensor) -> bool:
    """A 4-D tensor in PyTorch's default format that channels-last would lay out differently."""
    return tensor.dim() == 4 and tensor.is_contiguous() and not tensor.is_contiguous(memory_format=_CHANNELS_LAST)
