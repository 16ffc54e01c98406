"""The Tianshou algorithms rlaccel has a fused update for: one entry each, the one place that says so.

From it come the dispatch (:func:`rlaccel_tianshou.fused.fused_update_for`, :func:`rlaccel_tianshou.fused.learns`),
which algorithms have a compiled step (:func:`rlaccel_tianshou.fused.compiled_unavailable`), ``SUPPORTED``
and the docs' support table. Each entry names its family module's learning step and its
eligibility check (which networks and policies the update covers; anything else runs Tianshou's own).
Strings only: importing this imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module


@dataclass(frozen=True)
class FusedAlgorithm:
    """One Tianshou algorithm (an exact ``tianshou.algorithm`` class: a subclass may change the update).

    ``learn`` and ``eligible`` name ``module:function`` in ``rlaccel_tianshou.fused``: ``learn(wrapper,
    algorithm, buffer, indices, weight, ...)`` and ``eligible(algorithm) -> bool``; ``covers`` says in words
    what ``eligible`` accepts. ``compiled`` names its compiled gradient step's builder the same way,
    ``compiled(algorithm, compile=True) -> CompiledStep | str`` (why not), or is None where it has none.
    """

    name: str
    family: str
    learn: str
    eligible: str
    covers: str
    on_policy: bool = False
    compiled: str | None = None

    def algorithm_class(self) -> type:
        return getattr(import_module("tianshou.algorithm"), self.name)

    def builder(self, which: str) -> Callable:
        module, _, name = getattr(self, which).partition(":")
        return getattr(import_module(f"rlaccel_tianshou.fused.{module}"), name)


ALGORITHMS = (
    FusedAlgorithm("DQN", "value_based", "value_based:dqn_learn", "value_based:dqn_eligible", "on a Tianshou Net",
                   compiled="value_based:compiled_dqn_step"),
    FusedAlgorithm("QRDQN", "value_based", "value_based:qrdqn_learn", "value_based:qrdqn_eligible",
                   "on a Tianshou Net"),
    FusedAlgorithm("DDPG", "actor_critic", "actor_critic:ddpg_learn", "actor_critic:ddpg_eligible",
                   "Tianshou's deterministic actor and critic on Nets"),
    FusedAlgorithm("TD3", "actor_critic", "actor_critic:td3_learn", "actor_critic:td3_eligible",
                   "Tianshou's deterministic actor and twin critics on Nets"),
    FusedAlgorithm("SAC", "actor_critic", "actor_critic:sac_learn", "actor_critic:sac_eligible",
                   "Tianshou's probabilistic actor and twin critics on Nets, fixed or auto-tuned alpha",
                   compiled="compiled_sac:compiled_sac_step"),
    FusedAlgorithm("PPO", "on_policy", "on_policy:ppo_learn", "on_policy:ppo_eligible",
                   "Tianshou's discrete or continuous actor and critic on Nets", on_policy=True),
)

SUPPORTED = tuple(f"{a.name} ({a.covers})" for a in ALGORITHMS)
COMPILED = tuple(a.name for a in ALGORITHMS if a.compiled)


def support_markdown() -> str:
    """The docs' table: each algorithm, its family module and what the fused update covers."""
    rows = ["| algorithm | fused update (`rlaccel_tianshou.fused`) | covers | compiled step |", "|---|---|---|---|"]
    rows += [f"| {a.name} | `{a.family}` | {a.covers} | {'with `compiled_updates: true`' if a.compiled else '—'} |"
             for a in ALGORITHMS]
    return "\n".join(rows)
