"""`SparseDenseUpdater`: train only the last layers on most optimizer steps."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.optim import Optimizer

from rlaccel_plugins.config import AccelConfig, TrainingConfig
from rlaccel_plugins.errors import ConfigError, RlaccelWarning
from rlaccel_plugins.updates.flops import StepFlops, measure_step_flops
from rlaccel_plugins.updates.layers import LayerMap, discover_layers, select_dense_params
from rlaccel_plugins.updates.schedule import SparseDenseSchedule

logger = logging.getLogger("rlaccel")


@dataclass
class Attachment:
    """One (module, optimizer) pair under the updater's control."""

    name: str
    module: nn.Module
    optimizer: Optimizer
    layer_map: LayerMap
    frozen: list[nn.Parameter]          # trained on full steps only
    dense: list[nn.Parameter]           # trained on every step
    flops: StepFlops | None
    steps: int = 0                      # optimizer steps taken since attach (or restored)
    full_updates: int = 0
    dense_updates: int = 0
    handle: Any = field(default=None, repr=False)


class SparseDenseUpdater:
    """Full update every ``sparse_update_interval`` optimizer steps, dense (last layers only) otherwise.

    On a dense step the other parameters have ``requires_grad=False`` and ``grad=None``: autograd
    skips their backward and optimizers skip them (their Adam moments, weight decay and values stay
    bit-identical). The switch happens in an ``Optimizer.register_step_post_hook``, so it works for
    any framework that calls ``optimizer.step()`` once per gradient step.

    Args:
        sparse_update_interval: a full update every this many steps (step 0 is full).
        dense_layers: negative layer indices counted back from the output along the autograd graph,
            per output branch (``[-3, -2, -1]``), and/or parameter-name globs (``"head.*"``).
        measure_flops: count forward/backward FLOPs once per attach (``torch.utils.flop_counter``).
        whole_network: what to do when ``dense_layers`` cover every trained layer of a network (nothing
            would ever be frozen): ``"warn"`` (an ``RlaccelWarning``: you asked for something that does
            nothing here) or ``"info"`` (one log line; what the adapters use, so a preset applied to a
            small network does not warn). Either way every step of that network counts as full.

    Examples:
        >>> import torch, rlaccel_plugins as rla
        >>> net = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(5)])
        >>> opt = torch.optim.Adam(net.parameters())
        >>> upd = rla.SparseDenseUpdater(sparse_update_interval=100, dense_layers=[-2, -1])
        >>> upd.attach(net, opt, example_input=torch.zeros(4, 8)).layer_map.describe()
        '-1: 4, -2: 3, -3: 2, -4: 1, -5: 0'
        >>> for _ in range(3):
        ...     opt.zero_grad(); net(torch.randn(4, 8)).sum().backward(); opt.step()
        >>> upd.stats["full_updates"], upd.stats["dense_updates"]
        (1, 2)
        >>> upd.detach()
    """

    def __init__(self, sparse_update_interval: int = 100, dense_layers: Sequence[int | str] = (-3, -2, -1), *,
                 measure_flops: bool = True, whole_network: str = "warn") -> None:
        checked = TrainingConfig(sparse_update_interval=sparse_update_interval,
                                 dense_layers=dense_layers)  # type: ignore[arg-type]  # validated there
        if whole_network not in ("warn", "info"):
            raise ConfigError(f"whole_network must be 'warn' or 'info', got whole_network={whole_network!r}.")
        self.whole_network = whole_network
        self.schedule = SparseDenseSchedule(checked.sparse_update_interval)
        self.dense_layers = checked.dense_layers
        self.measure_flops = measure_flops
        self.attachments: list[Attachment] = []
        self._pending_state: list[dict] | None = None

    @classmethod
    def from_config(cls, config: AccelConfig, **kwargs: Any) -> SparseDenseUpdater:
        """Build from an :class:`AccelConfig`'s ``training`` block."""
        return cls(config.training.sparse_update_interval, config.training.dense_layers, **kwargs)

    # ------------------------------------------------------------------ attach / detach
    def attach(self, module: nn.Module, optimizer: Optimizer, example_input: Any = None, *,
               forward_fn: Callable[[nn.Module], Any] | None = None, name: str | None = None) -> Attachment:
        """Put ``optimizer``'s steps on ``module`` under the sparse/dense schedule.

        Args:
            module: the network (or part of it) the optimizer trains.
            optimizer: a ``torch.optim.Optimizer`` owning (some of) the module's parameters; only
                those are ever frozen.
            example_input: a batch for one traced forward (``module(example_input)``; a tuple is
                unpacked as positional arguments, a dict as keywords).
            forward_fn: instead of ``example_input``, a callable ``forward_fn(module)`` returning the
                outputs the loss is computed from.
            name: label used in messages and stats (default: the module's class name).

        Attaching the same pair again returns the existing attachment.
        """
        name = name or type(module).__name__
        for att in self.attachments:
            if att.optimizer is optimizer:
                if att.module is module:
                    return att
                raise ConfigError(f"optimizer must be attached once, got optimizer of {name} already attached with "
                                  f"module {att.name}. Detach first, or attach the module that holds both.")
        if not isinstance(optimizer, Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer, got optimizer={type(optimizer).__name__}.")
        if example_input is None and forward_fn is None:
            raise ConfigError(f"example_input must be given (or forward_fn), got example_input=None for {name}. "
                              "Pass a batch of observations so the layers can be traced.")
        layer_map = discover_layers(module, example_input, forward_fn)
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = dict(module.named_parameters())
        trainable = {n: p for n, p in named.items() if id(p) in owned and p.requires_grad}
        if not trainable:
            raise ConfigError(f"optimizer must own trainable parameters of {name}, got an optimizer that owns none "
                              f"of {sorted(named)[:6]}{'...' if len(named) > 6 else ''}. "
                              "Attach each network with its own optimizer.")
        if self.schedule.interval > 1:
            dense_names = select_dense_params(module, layer_map, self.dense_layers, module_name=name)
        else:  # every update is full: nothing is ever frozen, so dense_layers do not apply
            dense_names = set(trainable)
        frozen = [p for n, p in trainable.items() if n not in dense_names]
        dense = [p for n, p in trainable.items() if n in dense_names]
        if not frozen and self.schedule.interval > 1:  # interval 1: every update is full anyway
            message = (f"rlaccel: dense_layers={list(self.dense_layers)} cover every trained layer of {name} "
                       f"({layer_map.describe()}); sparse/dense updates save nothing on this network, so every "
                       "update of it is full.")
            if self.whole_network == "warn":
                warnings.warn(message, RlaccelWarning, stacklevel=2)
            else:
                logger.info(message)
        flops = measure_step_flops(module, example_input, forward_fn, frozen) if self.measure_flops else None
        att = Attachment(name=name, module=module, optimizer=optimizer, layer_map=layer_map, frozen=frozen,
                         dense=dense, flops=flops)
        if self._pending_state is not None and len(self._pending_state) > len(self.attachments):
            self._restore(att, self._pending_state[len(self.attachments)])
        def after_step(_opt, _args, _kwargs) -> None:
            self._after_step(att)

        # what a compiled multi-step update asks before it runs steps without firing this hook between them
        after_step.rlaccel_freezes = bool(frozen)  # type: ignore[attr-defined]
        att.handle = optimizer.register_step_post_hook(after_step)
        self.attachments.append(att)
        self._set_mode(att)
        return att

    def detach(self) -> None:
        """Remove every hook and make every parameter trainable again (idempotent)."""
        for att in self.attachments:
            att.handle.remove()
            for p in att.frozen:
                p.requires_grad_(True)
        self.attachments = []

    # ------------------------------------------------------------------ the switch
    def _after_step(self, att: Attachment) -> None:
        if not att.frozen or self.schedule.is_full(att.steps):  # nothing frozen: every step trains it all
            att.full_updates += 1
        else:
            att.dense_updates += 1
        att.steps += 1
        self._set_mode(att)

    def _set_mode(self, att: Attachment) -> None:
        full = self.schedule.is_full(att.steps)
        for p in att.frozen:
            p.requires_grad_(full)
            if not full:
                p.grad = None

    def next_step_is_full(self, att: Attachment | None = None) -> bool:
        """Whether the next optimizer step of ``att`` (default: the first attachment) is full."""
        att = att or self.attachments[0]
        return not att.frozen or self.schedule.is_full(att.steps)

    # ------------------------------------------------------------------ counters and state
    @property
    def stats(self) -> dict[str, float]:
        """Counters summed over attachments.

        ``full_updates``, ``dense_updates``; with FLOP measurement also ``flops_forward``,
        ``flops_backward_full``, ``flops_backward_dense`` (per step on the traced batch),
        ``backward_saved_fraction`` (of a full backward), ``step_flops_ratio`` (dense step / full
        step, forward included) and ``backward_flops_saved`` (cumulative over dense steps taken).
        """
        out: dict[str, float] = {"full_updates": sum(a.full_updates for a in self.attachments),
                                 "dense_updates": sum(a.dense_updates for a in self.attachments)}
        measured = [(a, a.flops) for a in self.attachments if a.flops is not None]
        if measured:
            fwd = sum(f.forward for _, f in measured)
            full = sum(f.backward_full for _, f in measured)
            dense = sum(f.backward_dense for _, f in measured)
            out.update(flops_forward=fwd, flops_backward_full=full, flops_backward_dense=dense,
                       backward_saved_fraction=1.0 - dense / full if full else 0.0,
                       step_flops_ratio=(fwd + dense) / (fwd + full) if fwd + full else 1.0,
                       backward_flops_saved=sum(a.dense_updates * (f.backward_full - f.backward_dense)
                                                for a, f in measured))
        return out

    def state_dict(self) -> dict[str, Any]:
        """Per-attachment step counters, so a resumed run continues in the same phase."""
        attached = [{"name": a.name, "steps": a.steps, "full_updates": a.full_updates,
                     "dense_updates": a.dense_updates} for a in self.attachments]
        pending = (self._pending_state or [])[len(attached):]  # loaded, not yet attached: kept as loaded
        return {"sparse_update_interval": self.schedule.interval, "attachments": attached + pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters; attachments made later pick up their entries in attach order."""
        if not isinstance(state, dict) or "attachments" not in state:
            raise ValueError(f"state must be a SparseDenseUpdater.state_dict(), got {type(state).__name__}.")
        self._pending_state = list(state["attachments"])
        for att, entry in zip(self.attachments, self._pending_state):
            self._restore(att, entry)
            self._set_mode(att)

    @staticmethod
    def _restore(att: Attachment, entry: dict) -> None:
        att.steps, att.full_updates, att.dense_updates = entry["steps"], entry["full_updates"], entry["dense_updates"]
