"""What every fused SB3 update shares: the model's CUDA graphs kept between ``train()`` calls, the key
of a captured step, the mean of logged losses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlaccel_plugins.fused.compiled_step import steps_of
from rlaccel_plugins.fused.graphs import StepGraphs, graphs_possible


class GraphsPerModel:
    """The model's :class:`StepGraphs` (one per step function), kept from one ``train()`` call to the
    next — a captured graph holds the addresses of the parameters, gradients and optimizer state — and
    dropped when those change (``optimizer.load_state_dict``) or on :meth:`release`. ``compiled``: the
    algorithm's compiled-step builder (its registry entry's) where the steps run as one compiled call each
    (``training.compiled_updates``), else None."""

    def __init__(self, model, guard, cuda_graphs: bool, compiled: Callable | None = None) -> None:
        self.model, self.guard, self.cuda_graphs, self.compiled = model, guard, cuda_graphs, compiled
        self.steps: StepGraphs | None = None
        self.reason: str | None = None  # why the steps run eagerly on a CUDA device
        self.compiled_step: Any = None  # the compiled step the last train() call ran, if any
        self._fingerprint: tuple | None = None

    def get(self, step: Callable, optimizers: list, dict_observations: bool) -> StepGraphs:
        """The graphs for ``step`` (built on the first call; ``step`` must be the same function each time)."""
        if self.steps is not None and self.steps.enabled and _fingerprint(optimizers) != self._fingerprint:
            self.release()
        if self.steps is None:
            enabled = self.cuda_graphs and self.model.device.type == "cuda"
            if enabled:
                self.reason = graphs_possible(optimizers, self.guard) or (
                    "dict observations" if dict_observations else None) or (
                    "gSDE" if getattr(self.model, "use_sde", False) else None)
                enabled = self.reason is None
            self.steps = StepGraphs(step, optimizers, enabled=enabled, guard=self.guard).apply()
        self.steps.step = step
        return self.steps

    def finish(self, optimizers: list) -> None:
        """End of a ``train()`` call: the guard's device counters, and the storage the graphs hold."""
        if self.steps is not None and self.steps.enabled:  # eager steps hold no storage addresses
            self.steps.flush()
            self._fingerprint = _fingerprint(optimizers)

    @property
    def captured(self) -> int:
        return self.steps.captured if self.steps is not None else 0

    def release(self) -> None:
        if self.steps is not None:
            self.steps.restore()
            self.steps = None


def compiled_steps(model, graphs: GraphsPerModel) -> Callable[[], Any] | None:
    """``compiled_of()`` for a family's fused ``train()`` (None: its steps run eagerly): the model's compiled
    step (``graphs.compiled(model)``, made on first use and again when the optimizers were replaced), or None
    where it cannot run: autocast on, compilation failed, or the builder said why not (a string)."""
    build = graphs.compiled
    if build is None:
        return None
    step_of = steps_of(lambda: build(model), lambda: _optimizers_of(model))

    def compiled_of():
        graphs.compiled_step = step_of()
        return graphs.compiled_step
    return compiled_of


def _optimizers_of(model) -> list:
    if hasattr(model, "actor"):
        return [model.actor.optimizer, model.critic.optimizer, getattr(model, "ent_coef_optimizer", None)]
    return [model.policy.optimizer]


def _fingerprint(optimizers: list) -> tuple:
    """The storage of every parameter and optimizer-state tensor: what a captured graph has baked in."""
    return tuple((p.data_ptr(), *(v.data_ptr() for v in o.state.get(p, {}).values() if torch.is_tensor(v)))
                 for o in optimizers for g in o.param_groups for p in g["params"])


def step_key(steps: StepGraphs, parameters: list, optimizers: list, inputs: tuple, *branches) -> tuple | None:
    """What changes a captured step (None when nothing is captured): which parameters get gradients
    (the sparse/dense phase), the learning rates, the inputs' shapes (constants: their values), and the
    caller's host-side branches."""
    if not steps.enabled:
        return None
    return (tuple(p.requires_grad for p in parameters), tuple(g["lr"] for o in optimizers for g in o.param_groups),
            tuple(x.shape if torch.is_tensor(x) else x for x in inputs), *branches)


def mean_of(values: list[torch.Tensor]) -> float:
    """``np.mean`` of the values' ``.item()``s, as SB3 logs them (one host sync per call, not per step)."""
    return np.mean(torch.stack(values).double().cpu().numpy())


def replay_loops(model, compiled: Any, k: int, parameters: list) -> bool:
    """Whether an off-policy ``train()`` chunk of ``k`` gradient steps runs as one compiled loop: more than one,
    as many as the model's ``gradient_steps`` (one loop length, one compilation), the step can loop that many
    (``compiled.can_loop(k)``), no layer frozen now or by a hook between them."""
    return 1 < k == model.gradient_steps and compiled.can_loop(k) and all(p.requires_grad for p in parameters)
