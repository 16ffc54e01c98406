"""A whole gradient step compiled into one call: the loss's gradients, the framework's gradient clipping,
the gradient guard's check and the Adam update, as TorchInductor code with its C++ wrapper.

Why: on the CPU an eager step of an RL-sized network spends more time between its matrix products than
in them — Python and dispatch per op, autograd's bookkeeping, one pass over memory per stage of Adam —
and a host sync per step where a guard reads the gradient norm (``benchmarks/peer_phases.py`` shows the
split). Compiled whole, the products stay the same ATen calls and everything between them becomes a few
fused C++ loops, called without Python per op; the guard's check and its counters stay in the graph
(read once per :meth:`CompiledStep.flush`), so no step waits on the host. This is what SBX gets from
``jax.jit``; here the framework's own networks and optimizer state are updated in place, so everything
else (saving, logging, the next eager step) sees what it always sees.

The math is the step's: the same loss, ``torch.func.grad`` of it, the framework's clip
(``clip_grad_norm_``'s formula), the guard's skip of a non-finite step, and PyTorch's Adam formulas on
the optimizer's own ``exp_avg``/``exp_avg_sq``/``step`` tensors. The rounding is not eager's: inductor
sums the bias gradients and norms in another order and does not use eager's fused multiply-adds, so a
compiled run agrees with the eager one within a tolerance derived on the running CPU, not bit for bit
(``tests/equivalence/test_compiled_step.py``) — which is why it is a config key
(``training.compiled_updates``).

Eligible (:func:`ineligible` says why not): ``Adam`` or ``AdamW`` with float hyper-parameters, no
``amsgrad``/``maximize``/``capturable``/``differentiable``/``weight_decay``, every parameter a CPU float32
tensor with a gradient this step, one shared step count, no step pre-hook; a guard without fp16 loss
scaling or ``restore_last_good``. Step post-hooks (the sparse/dense schedule) run after every step, as
``optimizer.step()`` runs them. Where ``torch.compile`` is unavailable or fails, :class:`CompiledStep`
warns once and runs the caller's eager step instead (:attr:`CompiledStep.failed`).

The pieces: :class:`AdamOperand` is one optimizer as a compiled step sees it (its parameters, state,
step scalars and guard); :func:`adam_update_` is the in-graph update of one operand; :class:`CompiledCall`
compiles a step function once per process and falls back to it eagerly; :class:`CompiledStep`
puts them together for a step with one loss and one optimizer (DQN). An adapter's step with several
optimizers (SAC: entropy coefficient, critic, actor) uses the pieces directly.

Examples:
    >>> import torch
    >>> net = torch.nn.Linear(3, 1)
    >>> optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    >>> def loss_of(params, x, y):
    ...     loss = torch.nn.functional.mse_loss(torch.nn.functional.linear(x, *params), y)
    ...     return loss, loss.detach()
    >>> ineligible(optimizer) is None
    True
    >>> step = CompiledStep(loss_of, list(net.parameters()), optimizer, compile=False)  # True: compiled
    >>> loss = step(torch.ones(4, 3), torch.zeros(4, 1))
    >>> int(optimizer.state[net.weight]["step"])
    1
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlaccel_plugins.checkpoint import StoppedWaiting
from rlaccel_plugins.fused.compiled_cache import PersistedCompile, thread_independent_guards
from rlaccel_plugins.fused.torch_support import (
    PrivateApis,
    compile_unsupported,
    persist_unsupported,
    private_apis,
    step_hooks,
)

ADAMS = (torch.optim.Adam, torch.optim.AdamW)
_NUMBERS = (int, float)

log = logging.getLogger(__name__)


def ineligible(optimizer: torch.optim.Optimizer, guard: Any = None) -> str | None:
    """Why ``optimizer`` (with ``guard``) cannot be stepped by a compiled step, or None when it can."""
    unsupported = compile_unsupported(warn=True)
    if unsupported is not None:
        return unsupported
    if type(optimizer) not in (*ADAMS, torch.optim.RMSprop):
        return f"{type(optimizer).__name__} (Adam, AdamW and RMSprop are compiled)"
    if len(optimizer.param_groups) != 1:
        return "more than one parameter group"
    group = optimizer.param_groups[0]
    if type(optimizer) in ADAMS:
        if group["amsgrad"] or group["maximize"] or group["capturable"] or group["differentiable"] or group.get("fused"):
            return "amsgrad, maximize, capturable, differentiable or fused set"
        numbers = (group["lr"], group["eps"], *group["betas"])
    else:
        if group["momentum"] or group["centered"] or group["maximize"] or group["capturable"] or group["differentiable"]:
            return "RMSprop's momentum, centered, maximize, capturable or differentiable set"
        numbers = (group["lr"], group["eps"], group["alpha"])
    if group["weight_decay"] != 0:
        return "weight decay"
    if not all(type(v) in _NUMBERS for v in numbers):
        return "tensor hyper-parameters"
    if any(p.dtype is not torch.float32 or not p.is_cpu for p in group["params"]):
        return "parameters not CPU float32"
    if step_hooks(optimizer)[0] or _apis().global_pre_hooks:
        return "an optimizer step pre-hook (it would look for gradients the compiled step never writes)"
    if guard is not None and (guard.loss_scaler is not None or guard.restore_last_good):
        return "the guard's fp16 loss scaling or restore_last_good"
    step = optimizer.__dict__.get("step")
    if step is not None and getattr(step, "rlaccel_guard", None) is not guard:
        return "optimizer.step is wrapped (an LR scheduler's or a user's wrapper would not run)"
    return None


class AdamOperand:
    """One eligible optimizer as a compiled step reads and writes it: aliases of its parameters, its
    ``exp_avg``/``exp_avg_sq``/``step`` tensors (made as Adam makes them on its first step, re-read when
    ``load_state_dict`` replaced them), the coming step's scalars, and the guard's counters.

    Args:
        optimizer: an eligible ``Adam``/``AdamW`` (:func:`ineligible`).
        params: its parameters, in the order the step's loss takes them (checked: exactly the optimizer's).
        max_grad_norm: the framework's clip (``clip_grad_norm_`` before the step), or None.
        guard: the :class:`~rlaccel_plugins.updates.guard.GradientGuard` attached to ``optimizer``, if any.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], *,
                 max_grad_norm: float | None = None, guard: Any = None) -> None:
        group = optimizer.param_groups[0]
        if [id(p) for p in params] != [id(p) for p in group["params"]]:
            raise ValueError("params must be exactly the optimizer's parameters, in its order")
        self.optimizer, self.guard = optimizer, guard
        self.params = [p.detach() for p in params]  # aliases: the step writes the parameters in place
        self._owners = list(params)
        guard_clip = guard.max_grad_norm if guard is not None else None
        # the optimizer's own constants, then _guarded's: the framework's clip, the guard's clip and skip
        self.hyper = (*self._constants(group), None if max_grad_norm is None else float(max_grad_norm),
                      None if guard_clip is None else float(guard_clip), bool(guard is not None and guard.skip_nonfinite))
        self._counts = torch.zeros(3)  # the guard's: guarded, skipped, clipped
        self._scalars = torch.zeros(2)  # Adam's step size and bias_correction2_sqrt for the coming step
        self._scalars_np = self._scalars.numpy()
        self._state: tuple | None = None

    @staticmethod
    def _constants(group: dict) -> tuple[float, ...]:
        beta1, beta2 = group["betas"]
        return float(beta1), float(beta2), float(group["eps"])

    @staticmethod
    def update(grads: Sequence[torch.Tensor], operand: tuple, hyper: tuple) -> None:
        """The in-graph update of this kind of optimizer (:func:`adam_update_`)."""
        adam_update_(grads, operand, hyper)

    def tensors(self) -> tuple:
        """What :func:`adam_update_` takes, ready for the coming step."""
        exp_avgs, exp_avg_sqs, steps = self._bind_state()
        self._set_scalars(steps[0])
        return self.params, exp_avgs, exp_avg_sqs, steps, self._scalars, self._counts

    def stepped(self, times: int = 1) -> None:
        """After the step(s): the optimizer's step post-hooks (the sparse/dense schedule), as ``step()`` runs them."""
        for _ in range(times):
            for hook in self._post_hooks():
                hook(self.optimizer, (), {})

    def hooks_can_wait(self) -> bool:
        """Whether the step post-hooks may run after several steps instead of between them: none, or only
        the sparse/dense schedule's where it never freezes a layer (its dense layers are the whole network)."""
        return all(getattr(hook, "rlaccel_freezes", True) is False for hook in self._post_hooks())

    def _post_hooks(self) -> list:
        return [*step_hooks(self.optimizer)[1].values(), *_apis().global_post_hooks.values()]

    def scan_tensors(self, steps: int) -> tuple:
        """What :func:`adam_scan_` takes for ``steps`` steps: the tensors, with a table of each coming step's
        scalars (row ``j``: the ``j``-th step taken from now, so a skipped step shifts nothing)."""
        exp_avgs, exp_avg_sqs, step_tensors = self._bind_state()
        t0 = step_tensors[0].item()
        table = torch.tensor([self._step_scalars(t0 + j + 1) for j in range(steps)], dtype=torch.float32)
        return self.params, exp_avgs, exp_avg_sqs, step_tensors, table, self._counts

    def flush(self) -> None:
        """Add the guard's counters kept in the graph to its ``stats`` (one read of a CPU tensor)."""
        if self.guard is not None:
            self.guard.add_counts(self._counts)

    def _set_scalars(self, step: torch.Tensor) -> None:
        self._scalars_np[:] = self._step_scalars(step.item() + 1)

    def _step_scalars(self, t: float) -> tuple[float, float]:
        """Adam's step size and ``bias_correction2_sqrt`` for step ``t``, computed as PyTorch computes them:
        Python floats from the step count (a CPU tensor: reading it waits on nothing), rounded to float32
        where its kernels take them. Computed in the graph they would be recomputed per vector of every
        loop (inductor inlines scalar math into its consumers)."""
        beta1, beta2 = (float(beta) for beta in self.optimizer.param_groups[0]["betas"])
        return (self.optimizer.param_groups[0]["lr"] / (1 - beta1 ** t)) * -1, (1 - beta2 ** t) ** 0.5

    def _bind_state(self) -> tuple:
        states = [self.optimizer.state[p] for p in self._owners]
        if self._state is not None and all(s.get("exp_avg") is m for s, m in zip(states, self._state[0])):
            return self._state
        for p, state in zip(self._owners, states):
            if len(state) == 0:  # what Adam's _init_group puts there
                state["step"] = torch.zeros((), dtype=_apis().scalar_dtype())
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        steps = [s["step"] for s in states]
        if len({float(s) for s in steps}) != 1:
            raise ValueError("the optimizer's parameters have different step counts; a compiled step shares one")
        self._state = ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], steps)
        return self._state


class RMSpropOperand(AdamOperand):
    """One eligible ``RMSprop`` (no momentum, not centered) as a compiled step reads and writes it: its
    ``square_avg`` and ``step`` tensors (made as RMSprop makes them on its first step) and the coming step's
    ``-lr``; the rest as :class:`AdamOperand` (whose loop :func:`adam_scan_` it has no counterpart of)."""

    @staticmethod
    def _constants(group: dict) -> tuple[float, ...]:
        return float(group["alpha"]), float(group["eps"])

    @staticmethod
    def update(grads: Sequence[torch.Tensor], operand: tuple, hyper: tuple) -> None:
        """:func:`rmsprop_update_`."""
        rmsprop_update_(grads, operand, hyper)

    def tensors(self) -> tuple:
        """What :func:`rmsprop_update_` takes, ready for the coming step."""
        square_avgs, steps = self._bind_state()
        self._scalars_np[0] = -self.optimizer.param_groups[0]["lr"]
        return self.params, square_avgs, steps, self._scalars, self._counts

    def hooks_can_wait(self) -> bool:
        return False  # no loop: one step per call

    def _bind_state(self) -> tuple:
        states = [self.optimizer.state[p] for p in self._owners]
        if self._state is not None and all(s.get("square_avg") is v for s, v in zip(states, self._state[0])):
            return self._state
        for p, state in zip(self._owners, states):
            if len(state) == 0:  # what RMSprop's _init_group puts there (no momentum, not centered)
                state["step"] = torch.zeros((), dtype=_apis().scalar_dtype())
                state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self._state = ([s["square_avg"] for s in states], [s["step"] for s in states])
        return self._state


def operand_for(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], **kwargs: Any) -> AdamOperand:
    """The operand of an eligible optimizer (:func:`ineligible`): :class:`RMSpropOperand` for ``RMSprop``,
    else :class:`AdamOperand`."""
    kind = RMSpropOperand if type(optimizer) is torch.optim.RMSprop else AdamOperand
    return kind(optimizer, params, **kwargs)


def guard_of(optimizer: torch.optim.Optimizer) -> Any:
    """The gradient guard wrapping ``optimizer.step``, or None."""
    return getattr(optimizer.__dict__.get("step"), "rlaccel_guard", None)


def built(make: Callable[[], Any], optimizers: Sequence[torch.optim.Optimizer | None]) -> Any:
    """An adapter's compiled step, ``make()``, or why it cannot be made: the first of ``optimizers`` (None:
    absent) that :func:`ineligible` refuses with its guard, or the ``ValueError`` of an optimizer that holds
    other parameters than its network's."""
    for optimizer in optimizers:
        reason = ineligible(optimizer, guard_of(optimizer)) if optimizer is not None else None
        if reason is not None:
            return reason
    try:
        return make()
    except ValueError as error:
        return str(error)


class CompiledCall:
    """``function`` compiled once per process (TorchInductor with its C++ wrapper; random ops draw from
    torch's generator), called with the same arguments; where compilation fails, one warning and the
    function itself from then on (:attr:`failed` says why), as where a stop signal cuts its compilation short
    (:func:`~rlaccel_plugins.checkpoint.stop_cuts_short`). ``compile=False``: the function itself."""

    def __init__(self, function: Callable, compile: bool = True) -> None:
        self.function = function
        self.failed: str | None = None
        self._call = _compiled(function) if compile else function

    def __call__(self, *args: Any) -> Any:
        try:
            return self._call(*args)
        except StoppedWaiting:  # the run is stopping: this call and every later one run eagerly
            self.failed = "a stop signal arrived while it compiled"
            self._call = self.function
            log.info("rlaccel: %s; the update runs eagerly until the run stops", self.failed)
            return self.function(*args)
        except Exception as error:
            if self._call is self.function:
                raise
            self._fail(error)
            return self.function(*args)

    def _fail(self, error: Exception) -> None:
        from rlaccel_plugins.errors import RlaccelWarning

        self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        self._call = self.function
        warnings.warn(f"rlaccel: torch.compile failed for the compiled update ({self.failed}); running the same "
                      "step eagerly. Set training.compiled_updates: false to skip the attempt.",
                      RlaccelWarning, stacklevel=3)


class CompiledStep:
    """``loss_of``'s gradient step on ``optimizer``, compiled: call it with the step's inputs, get the
    logged loss back (a tensor; no host sync).

    Args:
        loss_of: ``loss_of(params, *static, *inputs) -> (loss to differentiate, loss to log)``, a pure
            function of the tensors (no module calls: its identity, ``static`` and the inputs' shapes are
            what the compiled code is keyed on, so models of one shape share one compilation per process).
        params: the tensors ``loss_of`` differentiates, in its order; exactly the optimizer's parameters.
        optimizer: an eligible ``Adam``/``AdamW`` (:func:`ineligible`).
        static: constants ``loss_of`` takes before the inputs (a network's layer kinds).
        max_grad_norm: the framework's clip (``clip_grad_norm_`` before the step), or None.
        guard: the :class:`~rlaccel_plugins.updates.guard.GradientGuard` attached to ``optimizer``, if any.
        compile: ``False`` runs the same function eagerly (tests, and where compilation failed).
    """

    def __init__(self, loss_of: Callable, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer, *,
                 static: tuple = (), max_grad_norm: float | None = None, guard: Any = None, compile: bool = True) -> None:
        self.loss_of, self.static, self.optimizer = loss_of, static, optimizer
        self.operand = operand_for(optimizer, params, max_grad_norm=max_grad_norm, guard=guard)
        self.call = CompiledCall(_one_loss_step, compile)
        self.loop = CompiledCall(adam_scan_, compile)

    @property
    def failed(self) -> str | None:
        return self.call.failed or self.loop.failed

    @property
    def parameters(self) -> list[torch.Tensor]:
        """The trained parameters (where one is frozen, on a dense step of the sparse/dense schedule, the caller
        runs its eager step)."""
        return self.operand._owners

    def __call__(self, *inputs: Any) -> torch.Tensor:
        loss = self.call(self.loss_of, self.operand.tensors(), self.static + inputs, self.operand.hyper,
                         self.operand.update)
        self.operand.stepped()
        return loss

    def flush(self) -> None:
        self.operand.flush()

    def can_loop(self, steps: int | None = None) -> bool:
        """Whether :meth:`steps` may run (``steps`` of them: any number; its post-hooks can wait until the
        loop's end)."""
        return self.operand.hooks_can_wait()

    def steps(self, *stacked: Any) -> torch.Tensor:
        """``len(stacked[0])`` steps in one compiled call (:func:`adam_scan_`): row ``j`` of each input is
        step ``j``'s; the logged losses of every step come back. Only where :meth:`can_loop`."""
        losses = self.loop(self.loss_of, self.operand.scan_tensors(len(stacked[0])), self.static, stacked,
                           self.operand.hyper)
        self.operand.stepped(len(stacked[0]))
        return losses


def steps_of(build: Callable[[], Any], optimizers_of: Callable[[], Sequence[Any]]) -> Callable[[], Any]:
    """``compiled_of()`` for an adapter's update: the step ``build()`` makes (a :class:`CompiledStep`, or a
    string saying why not), made on first use and again when ``optimizers_of()`` returns other optimizers
    (a loaded checkpoint's); None where it cannot run now — autocast on, compilation failed, or ``build``
    said why not."""
    made: dict[str, Any] = {}

    def compiled_of() -> Any:
        if torch.is_autocast_enabled("cpu"):
            return None
        optimizers = tuple(id(o) for o in optimizers_of())
        if made.get("optimizers") != optimizers:
            made.update(optimizers=optimizers, step=build())
        step = made["step"]
        return None if isinstance(step, str) or step.failed is not None else step
    return compiled_of


def _apis() -> PrivateApis:
    """The private APIs (a compiled step is made only where :func:`ineligible` found them)."""
    apis = private_apis()
    if isinstance(apis, str):
        raise TypeError(apis)
    return apis


def _total_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """``clip_grad_norm_``'s total norm: the norm of the per-tensor norms."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def _one_loss_step(loss_of: Callable, operand: tuple, inputs: tuple, hyper: tuple, update: Callable) -> torch.Tensor:
    """:class:`CompiledStep`'s step: the loss's gradients, then the optimizer's ``update`` (:func:`adam_update_`,
    :func:`rmsprop_update_`)."""
    grads, logged = torch.func.grad(lambda p: loss_of(p, *inputs), has_aux=True)(operand[0])
    update(grads, operand, hyper)
    return logged


def adam_update_(grads: Sequence[torch.Tensor], operand: tuple, hyper: tuple) -> None:
    """In a step function: the framework's clip, the guard's check and Adam's update of one
    :class:`AdamOperand` (``operand``: its :meth:`~AdamOperand.tensors`, ``hyper``: its ``hyper``), in place.
    A step the guard skips (non-finite norm) leaves parameters, state and step counts as they were."""
    params, exp_avgs, exp_avg_sqs, steps, scalars, counts = operand
    with torch.no_grad():
        new_p, new_m, new_v, ok, counted = _adam_arithmetic(grads, params, exp_avgs, exp_avg_sqs, scalars, hyper)
        for target, value in zip([*params, *exp_avgs, *exp_avg_sqs], [*new_p, *new_m, *new_v]):
            target.copy_(value)
        for s in steps:
            s.add_(ok.float())
        counts.add_(counted)


def _guarded(grads: Sequence[torch.Tensor], clip: float | None, guard_clip: float | None,
             skip_nonfinite: bool) -> tuple:
    """The framework's clip, then the guard's check and clip: ``(grads, ok, counts)``, ``ok`` false where the
    guard skips the step (a non-finite norm); ``counts``: this step's guarded, skipped, clipped."""
    if clip is not None:  # the framework's clip_grad_norm_
        coef = torch.clamp(clip / (_total_norm(grads) + 1e-6), max=1.0)
        grads = [g * coef for g in grads]
    norm = _total_norm(grads)  # the guard's check reads the clipped gradients, as it does eagerly
    ok = torch.isfinite(norm) if skip_nonfinite else torch.ones((), dtype=torch.bool)
    clipped = torch.zeros((), dtype=torch.bool)
    if guard_clip is not None:
        clipped = norm > guard_clip
        coef = torch.clamp(guard_clip / (norm + 1e-6), max=1.0)
        grads = [g * coef for g in grads]
    return grads, ok, torch.stack([torch.ones(()), (~ok).float(), (clipped & ok).float()])


def _adam_arithmetic(grads: Sequence[torch.Tensor], params: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
                     exp_avg_sqs: Sequence[torch.Tensor], scalars: torch.Tensor, hyper: tuple) -> tuple:
    """The framework's clip, the guard's check and Adam's formulas (PyTorch's, in its op order), as new
    tensors: ``(params, exp_avgs, exp_avg_sqs, ok, counts)``; where not ``ok`` (a non-finite norm the
    guard skips) the old values. ``counts``: this step's guarded, skipped, clipped."""
    beta1, beta2, eps = hyper[:3]
    grads, ok, counted = _guarded(grads, *hyper[3:])
    step_size, bias_correction2_sqrt = scalars[0], scalars[1]
    new_p, new_m, new_v = [], [], []
    for p, m, v, g in zip(params, exp_avgs, exp_avg_sqs, grads):
        m_next = torch.lerp(m, g, 1 - beta1)
        v_next = torch.addcmul(v * beta2, g, g, value=1 - beta2)
        denom = torch.sqrt(v_next) / bias_correction2_sqrt + eps
        new_p.append(torch.where(ok, p + (step_size * m_next) / denom, p))
        new_m.append(torch.where(ok, m_next, m))
        new_v.append(torch.where(ok, v_next, v))
    return new_p, new_m, new_v, ok, counted


def rmsprop_update_(grads: Sequence[torch.Tensor], operand: tuple, hyper: tuple) -> None:
    """:func:`adam_update_` for an :class:`RMSpropOperand`: the clip, the guard's check and PyTorch's RMSprop
    (no momentum, not centered) in its op order, in place."""
    params, square_avgs, steps, scalars, counts = operand
    alpha, eps = hyper[:2]
    with torch.no_grad():
        grads, ok, counted = _guarded(grads, *hyper[2:])
        for p, v, g in zip(params, square_avgs, grads):
            v_next = torch.addcmul(v * alpha, g, g, value=1 - alpha)
            avg = torch.sqrt(v_next) + eps
            p.copy_(torch.where(ok, p + (scalars[0] * g) / avg, p))
            v.copy_(torch.where(ok, v_next, v))
        for s in steps:
            s.add_(ok.float())
        counts.add_(counted)


def adam_scan_(loss_of: Callable, operand: tuple, static: tuple, xs: tuple, hyper: tuple) -> torch.Tensor:
    """``len(xs[0])`` steps of ``loss_of`` and :func:`adam_update_`'s arithmetic as one loop in the graph
    (``torch._higher_order_ops.scan``, as ``jax.lax.scan`` runs SBX's steps): step ``j`` reads row ``j`` of
    every tensor in ``xs``; the weights and Adam's state are the loop's carry, written back once at the
    end. ``operand``: :meth:`AdamOperand.scan_tensors`. Returns the logged loss of every step."""
    params, exp_avgs, exp_avg_sqs, steps, table, counts = operand
    n = len(params)

    def one_step(carry, x):
        p, m, v, taken, counted = list(carry[:n]), carry[n:2 * n], carry[2 * n:3 * n], carry[3 * n], carry[3 * n + 1]
        grads, logged = torch.func.grad(lambda q: loss_of(q, *static, *x), has_aux=True)(p)
        scalars = torch.index_select(table, 0, taken.reshape(1))[0]  # a tensor index: no host read
        new_p, new_m, new_v, ok, step_counts = _adam_arithmetic(grads, p, m, v, scalars, hyper)
        return (*new_p, *new_m, *new_v, taken + ok.long(), counted + step_counts), logged

    init = (*[p.clone() for p in params], *[m.clone() for m in exp_avgs], *[v.clone() for v in exp_avg_sqs],
            torch.zeros((), dtype=torch.long), torch.zeros(3))
    if torch.compiler.is_compiling():
        carry, logged = _scan(one_step, init, xs)
    else:  # the same steps as a Python loop (the eager fallback, and tests without the compiler)
        carry, outputs = init, []
        for j in range(len(xs[0])):
            carry, out = one_step(carry, tuple(x[j] for x in xs))
            outputs.append(out)
        logged = torch.stack(outputs)
    with torch.no_grad():
        for target, value in zip([*params, *exp_avgs, *exp_avg_sqs], carry[:3 * n]):
            target.copy_(value)
        for s in steps:
            s.add_(carry[3 * n].float())
        counts.add_(carry[3 * n + 1])
    return logged


def adam_state_step(grads: Sequence[torch.Tensor], state: list) -> list:
    """In a step function run by :func:`run_steps_`: one Adam step of an operand's state (the framework's
    clip, the guard's check, Adam's formulas), as a new state. ``state``: ``[params, exp_avgs, exp_avg_sqs,
    table, taken, counts, hyper]``; the step's scalars are row ``taken`` of ``table`` (a tensor index: no
    host read), so a step the guard skips shifts nothing."""
    params, exp_avgs, exp_avg_sqs, table, taken, counts, hyper = state
    with torch.no_grad():
        scalars = torch.index_select(table, 0, taken.reshape(1))[0]
        new_p, new_m, new_v, ok, counted = _adam_arithmetic(grads, params, exp_avgs, exp_avg_sqs, scalars, hyper)
    return [new_p, new_m, new_v, table, taken + ok.long(), counts + counted, hyper]


def polyak(targets: Sequence[torch.Tensor], params: Sequence[torch.Tensor], tau: float) -> list[torch.Tensor]:
    """SB3's ``polyak_update`` (``mul_``, then ``add_``) as new tensors."""
    with torch.no_grad():
        return [torch.add(t * (1 - tau), p, alpha=tau) for t, p in zip(targets, params)]


def selected(flag: bool | torch.Tensor, new: Callable[[], list], old: list) -> list:
    """``new()`` where ``flag``, else ``old``: a Python bool decides while tracing (one call's step), a bool
    tensor per element (a step of a loop, whose every row runs the same code)."""
    if isinstance(flag, bool):
        return new() if flag else old
    return [torch.where(flag, n, o) for n, o in zip(new(), old)]


def run_steps_(body: Callable, operands: Sequence[tuple], hypers: Sequence[tuple], static: Any,
               carried: Sequence[torch.Tensor], xs: tuple, loop: bool) -> Any:
    """Gradient steps of several optimizers (an actor-critic's), written back in place: ``body(static, states,
    carried, x) -> (states, carried, logged)`` takes one step (or a fixed group of steps) with
    :func:`adam_state_step` on ``states`` (one per operand, see there) and returns the new ones, with the new
    ``carried`` tensors (target networks) and what it logs. ``operands``: each operand's
    :meth:`AdamOperand.scan_tensors` for the steps to come; ``hypers``: their ``hyper``.

    ``loop=False``: ``body`` once on ``xs`` (a state it returns unchanged is not written back). ``loop=True``:
    once per row of every tensor in ``xs``, as one loop in the graph (``torch._higher_order_ops.scan``) with
    the weights, optimizer states and ``carried`` as its carry, written back once at the end; a Python loop
    when not compiling (the eager fallback). Returns ``logged``, stacked over the rows where it loops."""
    states = [[list(o[0]), list(o[1]), list(o[2]), o[4], torch.zeros((), dtype=torch.long), torch.zeros(3), h]
              for o, h in zip(operands, hypers)]
    if not loop:
        new_states, new_carried, logged = body(static, states, list(carried), xs)
    else:
        sizes = [len(o[0]) for o in operands]

        def flat(states_: list, carried_: Sequence[torch.Tensor]) -> tuple:
            return (*[t for s in states_ for t in (*s[0], *s[1], *s[2], s[4], s[5])], *carried_)

        def unflat(carry: Sequence[torch.Tensor]) -> tuple[list, list]:
            out, pos = [], 0
            for n, state in zip(sizes, states):
                p, m, v = list(carry[pos:pos + n]), list(carry[pos + n:pos + 2 * n]), list(carry[pos + 2 * n:pos + 3 * n])
                out.append([p, m, v, state[3], carry[pos + 3 * n], carry[pos + 3 * n + 1], state[6]])
                pos += 3 * n + 2
            return out, list(carry[pos:])

        def one_step(carry, x):
            states_, carried_ = unflat(carry)
            new_states_, new_carried_, logged_ = body(static, states_, carried_, x)
            # a loop's step may not return its carry itself (a target network this call never updates)
            return tuple(t.clone() if any(t is c for c in carry) else t for t in flat(new_states_, new_carried_)), logged_

        init = tuple(t.clone() for t in flat(states, carried))
        if torch.compiler.is_compiling():
            carry, logged = _scan(one_step, init, xs)
        else:
            carry, rows = init, []
            for j in range(len(xs[0])):
                carry, out = one_step(carry, tuple(x[j] for x in xs))
                rows.append(out)
            logged = tuple(torch.stack(column) for column in zip(*rows))
        new_states, new_carried = unflat(carry)
    with torch.no_grad():
        for operand, old, new in zip(operands, states, new_states):
            if new is old:
                continue
            for target, value in zip([*operand[0], *operand[1], *operand[2]], [*new[0], *new[1], *new[2]]):
                target.copy_(value)
            for s in operand[3]:
                s.add_(new[4].float())
            operand[5].add_(new[5])
        for target, value in zip(carried, new_carried):
            if value is not target:
                target.copy_(value)
    return logged


# torch's scan, bound before a loop is compiled: looked up inside the traced function it would be an import
# that the saved code's guards cannot hold
_scan: Any = None

_COMPILED: dict[Callable, Callable] = {}
# cpp_wrapper: the graph is called from C++, no Python per op; fallback_random: random ops draw from
# torch's generator, as eager does; cpp.threads: inductor's own loops on one thread (its matrix products
# are ATen's, on torch's threads at the time of the call), so the compiled code does not depend on the
# thread count at compile time and waits on no descheduled thread on a shared machine (rlaccel_plugins.threads);
# cpp_wrapper_build_separate: the wrapper (glue) built at -O1 apart from the kernels (-O3), which compiles no
# slower and runs faster here (benchmarks/investigations/wrapper_build.py: SAC 7.0 against 9.2 ms a step, DQN's
# loop 0.71 against 0.84; cold first call 27 and 18 s against 27 and 23 s); left out where inductor lacks it
OPTIONS: dict[str, Any] = {"cpp_wrapper": True, "fallback_random": True, "cpp.threads": 1,
                           "cpp_wrapper_build_separate": True}


def inductor_options() -> dict[str, Any]:
    """:data:`OPTIONS` less the settings this PyTorch's inductor does not have (an older one)."""
    import torch._inductor.config as inductor

    return {key: value for key, value in OPTIONS.items() if "." in key or hasattr(inductor, key)}


def _compiled(function: Callable) -> Callable:
    """``function`` compiled, one per function and process: kept on disk and loaded by later processes
    (:class:`~rlaccel_plugins.fused.compiled_cache.PersistedCompile`) where this PyTorch can, else under
    ``torch.compile`` (dynamo keys it on its inputs)."""
    global _scan
    _scan = _apis().scan
    if function not in _COMPILED:
        if persist_unsupported() is None:
            _COMPILED[function] = PersistedCompile(function, inductor_options())
        else:
            _COMPILED[function] = torch.compile(function, fullgraph=True, dynamic=False,
                                                options={**inductor_options(),
                                                         "guard_filter_fn": thread_independent_guards})
    return _COMPILED[function]
