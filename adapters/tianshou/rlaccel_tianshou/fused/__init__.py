"""Fused ``update()`` for Tianshou algorithms: the same math as the algorithm's own, in fewer ops.

Tianshou's off-policy update (``Algorithm._update``) samples a ``Batch`` of every field, computes n-step
returns over a copy of the whole buffer's ``done`` flags, builds a second ``Batch`` of every field for
``obs_next``, runs the networks through the policy's ``forward`` (DQN also takes an argmax to numpy it
does not need there) and converts the same observations to tensors once per network call. The fused
update draws the same indices (``buffer.sample_indices``: the same RNG draws), reads only the fields
the loss needs, computes the end flags only at the indices the n-step sum visits and hands them to
Tianshou's own ``_nstep_return``, converts each input once, runs the network modules directly with
the random draws (SAC's ``rsample``, TD3's target noise) in Tianshou's order — torch's ``Categorical``
and ``Normal`` as their own ops, without the objects' argument checks —, steps the optimizers as
Tianshou's own ``Algorithm.Optimizer`` does with rlaccel's flat Adam step (TD3's and SAC's two critic
losses in one backward, an actor's loss backpropagated into the actor's parameters only), and does the
Polyak target update in three multi-tensor ops with Tianshou's rounding. Tianshou's networks are called as the same tensor ops without their module calls where they can be
(:mod:`rlaccel_tianshou.flat_networks`). Equal to Tianshou's update,
tested step by step (``tests/equivalence/test_tianshou_fused.py``).

One module per algorithm family — :mod:`.value_based` (DQN, QR-DQN), :mod:`.actor_critic` (DDPG,
TD3, SAC), :mod:`.on_policy` (PPO) — over :mod:`.common`, each with its algorithms' eligibility checks;
:mod:`.registry` lists the algorithms, and :func:`fused_update_for` dispatches from it. Fused: ``DQN`` (plain and double, Huber or MSE, any n-step, with or without a target network) and
``QRDQN`` on a Tianshou ``Net``; ``DDPG``, ``TD3`` and ``SAC`` (fixed or auto-tuned alpha) with
Tianshou's ``ContinuousActorDeterministic`` / ``ContinuousActorProbabilistic`` actor and
``ContinuousCritic`` critics; with buffers of array observations, ``stack_num=1`` and without
prioritized replay. Anything else runs Tianshou's own update.

With ``training.compiled_updates: true``, DQN's and SAC's gradient steps (everything after the n-step returns:
the losses, backward, the clips, the optimizers' steps, SAC's Polyak average) run as one compiled call each on
the CPU (:func:`compiled_steps_for`; the registry's
``compiled`` field says which algorithms have one): equal within a derived tolerance, not bit for bit.
``auto`` keeps Tianshou's updates eager: no learning check has been run for them yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlaccel_tianshou.flat_networks import first_parameter
from rlaccel_tianshou.fused.common import fusable_buffer, off_policy_update, on_policy_update
from rlaccel_tianshou.fused.registry import ALGORITHMS, COMPILED, SUPPORTED

__all__ = ["COMPILED", "SUPPORTED", "compiled_steps_for", "compiled_unavailable", "first_parameter", "fusable_buffer",
           "fused_update_for", "learns"]


def fused_update_for(algorithm) -> Callable[[Any, Any, int | None], Any] | None:
    """``update(wrapper, buffer, sample_size)`` fusing ``algorithm``'s update, or None where there is no
    equivalence-tested one: a class not in the registry (exact classes only: a subclass may change the
    update), or networks and policies its family's eligibility check does not cover."""
    entry = _entry_of(algorithm)
    if entry is None or not entry.eligible(algorithm):
        return None
    wrap = on_policy_update if entry.on_policy else off_policy_update
    return wrap(entry.learn)


def compiled_unavailable(algorithm) -> str | None:
    """Why ``algorithm``'s gradient steps cannot run compiled (``training.compiled_updates``), or None."""
    entry = _entry_of(algorithm)
    if entry is None or entry.compiled is None or not entry.eligible(algorithm):
        return f"{type(algorithm).__name__} has no compiled step ({', '.join(COMPILED)} on a Net has)"
    step = entry.compiled(algorithm, compile=False)
    return step if isinstance(step, str) else None


def compiled_steps_for(algorithm) -> Callable[[], Any]:
    """``compiled_of()`` for the wrapper's update: ``algorithm``'s compiled step, built on first use and again
    when its optimizers were replaced; None where it cannot run now (autocast on, compilation failed, or its
    builder said why not). Only for an algorithm :func:`compiled_unavailable` accepts."""
    from rlaccel_plugins.fused.compiled_step import steps_of

    build = _entry_of(algorithm).compiled
    return steps_of(lambda: build(algorithm), lambda: [o._optim for o in algorithm._optimizers])


def _entry_of(algorithm):
    return next((a for a in ALGORITHMS if a.algorithm_class() is type(algorithm)), None)


def learns() -> dict[type, Callable]:
    """The dispatch table: a Tianshou algorithm class → its family's fused learning step,
    ``learn(wrapper, algorithm, buffer, indices, weight, ...)`` (from the registry)."""
    return {entry.algorithm_class(): entry.learn for entry in ALGORITHMS}
