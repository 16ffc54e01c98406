"""Importance weights on SB3's losses without touching ``train()``: an output-gradient hook.

SB3's off-policy losses are means of per-sample terms, so scaling the gradient flowing into the
Q-network output of sample ``i`` by ``w_i`` is exactly the weighted loss. Only the first
grad-enabled forward after each ``sample()`` is weighted (SAC calls its critic a second time for
the actor loss; that call is left alone).
"""

from __future__ import annotations

import torch

from rlaccel_plugins.updates.layers import tensors_in


class ImportanceWeightHook:
    """Scales output gradients of ``modules`` by the weights of the buffer's last sample."""

    def __init__(self, buffer, modules: list[torch.nn.Module]) -> None:
        self.buffer = buffer
        self._consumed: object = None
        self.handles = [m.register_forward_hook(self._hook) for m in modules]
        buffer.weights_applied_by = self  # the buffer warns when weights are drawn and nothing applies them

    def _hook(self, module, inputs, output) -> None:
        weights = self.buffer.last_weights
        if weights is None or not (torch.is_grad_enabled() and module.training) or self._consumed is weights:
            return
        outputs = [t for t in tensors_in(output) if t.requires_grad and t.shape[:1] == (len(weights),)]
        if not outputs:
            return
        self._consumed = weights
        w = torch.as_tensor(weights, device=outputs[0].device)
        for t in outputs:
            t.register_hook(lambda grad, w=w: grad * w.view(-1, *([1] * (grad.dim() - 1))).to(grad.dtype))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if getattr(self.buffer, "weights_applied_by", None) is self:
            self.buffer.weights_applied_by = None
