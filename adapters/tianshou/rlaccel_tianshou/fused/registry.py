"""The Tianshou algorithms rlaccel has a fused update for: one entry each, the one place that says so.

From it come the dispatch (:func:`rlaccel_tianshou.fused.fused_update_for`, :func:`rlaccel_tianshou.fused.learns`),
which algorithms have a compiled step (:func:`rlaccel_tianshou.fused.compiled_unavailable`), ``SUPPORTED``,
the framework code each update is verified against (:mod:`rlaccel_tianshou.verified`) and the docs' support table. Each entry names its family module's learning step and its
eligibility check (which networks and policies the update covers; anything else runs Tianshou's own): the
family modules' own functions. The Tianshou code is named by strings (``module:qualname``), fingerprinted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

from rlaccel_tianshou.fused.actor_critic import (
    ddpg_eligible,
    ddpg_learn,
    sac_eligible,
    sac_learn,
    td3_eligible,
    td3_learn,
)
from rlaccel_tianshou.fused.compiled_sac import compiled_sac_step
from rlaccel_tianshou.fused.on_policy import ppo_eligible, ppo_learn
from rlaccel_tianshou.fused.value_based import compiled_dqn_step, dqn_eligible, dqn_learn, qrdqn_eligible, qrdqn_learn

ALGO, NET = "tianshou.algorithm", "tianshou.utils.net"
_BASE = (f"{ALGO}.algorithm_base:Algorithm._update", f"{ALGO}.algorithm_base:OffPolicyAlgorithm.update",
         f"{ALGO}.algorithm_base:Algorithm.compute_nstep_return", f"{ALGO}.algorithm_base:_nstep_return",
         "tianshou.data.buffer.buffer_base:ReplayBuffer.sample_indices", f"{NET}.common:Net.forward")
_Q = (f"{ALGO}.modelfree.dqn:QLearningOffPolicyAlgorithm._preprocess_batch",
      f"{ALGO}.modelfree.dqn:QLearningOffPolicyAlgorithm._periodically_update_lagged_network_weights",
      f"{ALGO}.modelfree.dqn:DiscreteQLearningPolicy.forward")
_AC = (f"{ALGO}.modelfree.ddpg:ActorCriticOffPolicyAlgorithm._minimize_critic_squared_loss",
       f"{ALGO}.modelfree.ddpg:ActorCriticOffPolicyAlgorithm._target_q",
       f"{ALGO}.modelfree.ddpg:ActorCriticOffPolicyAlgorithm._preprocess_batch",
       f"{NET}.continuous:ContinuousCritic.forward")


@dataclass(frozen=True)
class FusedAlgorithm:
    """One Tianshou algorithm (an exact ``tianshou.algorithm`` class: a subclass may change the update).

    ``learn(wrapper, algorithm, buffer, indices, weight, ...)`` and ``eligible(algorithm) -> bool``: its family
    module's fused learning step and eligibility check; ``covers`` says in words what ``eligible`` accepts.
    ``replaces``: the Tianshou code the update computes as (fingerprinted in ``verified.json``). ``compiled``:
    its compiled gradient step's builder, ``compiled(algorithm, compile=True) -> CompiledStep | str`` (why
    not), or None where it has none.
    """

    name: str
    learn: Callable
    eligible: Callable
    covers: str
    replaces: tuple[str, ...]
    on_policy: bool = False
    compiled: Callable | None = None

    @property
    def family(self) -> str:
        """Its family module in ``rlaccel_tianshou.fused`` (``value_based``, ``actor_critic``, ``on_policy``)."""
        return self.learn.__module__.rsplit(".", 1)[-1]

    @property
    def key(self) -> str:
        """The key of its ``verified.json`` record."""
        return f"update:{self.name}"

    def algorithm_class(self) -> type:
        return getattr(import_module("tianshou.algorithm"), self.name)


ALGORITHMS = (
    FusedAlgorithm("DQN", dqn_learn, dqn_eligible, "on a Tianshou Net",
                   (f"{ALGO}.modelfree.dqn:DQN._update_with_batch", f"{ALGO}.modelfree.dqn:DQN._target_q", *_Q, *_BASE),
                   compiled=compiled_dqn_step),
    FusedAlgorithm("QRDQN", qrdqn_learn, qrdqn_eligible,
                   "on a Tianshou Net", (f"{ALGO}.modelfree.qrdqn:QRDQN._update_with_batch",
                                         f"{ALGO}.modelfree.qrdqn:QRDQN._target_q", *_Q, *_BASE)),
    FusedAlgorithm("DDPG", ddpg_learn, ddpg_eligible,
                   "Tianshou's deterministic actor and critic on Nets",
                   (f"{ALGO}.modelfree.ddpg:DDPG._update_with_batch", f"{ALGO}.modelfree.ddpg:DDPG._target_q_compute_action",
                    *_AC, *_BASE)),
    FusedAlgorithm("TD3", td3_learn, td3_eligible,
                   "Tianshou's deterministic actor and twin critics on Nets",
                   (f"{ALGO}.modelfree.td3:TD3._update_with_batch", f"{ALGO}.modelfree.td3:TD3._target_q_compute_action",
                    *_AC, *_BASE)),
    FusedAlgorithm("SAC", sac_learn, sac_eligible,
                   "Tianshou's probabilistic actor and twin critics on Nets, fixed or auto-tuned alpha",
                   (f"{ALGO}.modelfree.sac:SAC._update_with_batch", f"{ALGO}.modelfree.sac:SAC._target_q_compute_value",
                    f"{ALGO}.modelfree.sac:SACPolicy.forward", f"{ALGO}.modelfree.sac:correct_log_prob_gaussian_tanh",
                    *_AC, *_BASE),
                   compiled=compiled_sac_step),
    FusedAlgorithm("PPO", ppo_learn, ppo_eligible,
                   "Tianshou's discrete or continuous actor and critic on Nets",
                   (f"{ALGO}.modelfree.ppo:PPO._update_with_batch", f"{ALGO}.modelfree.ppo:PPO._preprocess_batch",
                    f"{ALGO}.modelfree.a2c:ActorCriticOnPolicyAlgorithm._add_returns_and_advantages",
                    f"{ALGO}.modelfree.reinforce:ProbabilisticActorPolicy.forward",
                    f"{ALGO}.algorithm_base:OnPolicyAlgorithm.update", f"{ALGO}.algorithm_base:Algorithm._update",
                    f"{ALGO}.algorithm_base:Algorithm.compute_episodic_return", f"{NET}.common:Net.forward"),
                   on_policy=True),
)

SUPPORTED = tuple(f"{a.name} ({a.covers})" for a in ALGORITHMS)
COMPILED = tuple(a.name for a in ALGORITHMS if a.compiled)


def support_markdown() -> str:
    """The docs' table: each algorithm, its family module and what the fused update covers."""
    rows = ["| algorithm | fused update (`rlaccel_tianshou.fused`) | covers | compiled step |", "|---|---|---|---|"]
    rows += [f"| {a.name} | `{a.family}` | {a.covers} | {'with `compiled_updates: true`' if a.compiled else '—'} |"
             for a in ALGORITHMS]
    return "\n".join(rows)
