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
TD3, SAC), :mod:`.on_policy` (PPO) — over :mod:`.common`; :func:`fused_update_for` holds the dispatch
table. Fused: ``DQN`` (plain and double, Huber or MSE, any n-step, with or without a target network) and
``QRDQN`` on a Tianshou ``Net``; ``DDPG``, ``TD3`` and ``SAC`` (fixed or auto-tuned alpha) with
Tianshou's ``ContinuousActorDeterministic`` / ``ContinuousActorProbabilistic`` actor and
``ContinuousCritic`` critics; with buffers of array observations, ``stack_num=1`` and without
prioritized replay. Anything else runs Tianshou's own update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlaccel_tianshou.flat_networks import first_parameter
from rlaccel_tianshou.fused import actor_critic, on_policy, value_based
from rlaccel_tianshou.fused.common import _on_nets, _on_policy_update, _update, fusable_buffer

__all__ = ["SUPPORTED", "first_parameter", "fusable_buffer", "fused_update_for"]

SUPPORTED = ("DQN and QRDQN on a Tianshou Net", "DDPG, TD3, SAC and PPO with Tianshou's actors and critics on a Net")


def fused_update_for(algorithm) -> Callable[[Any, Any, int | None], Any] | None:
    """``update(wrapper, buffer, sample_size)`` fusing ``algorithm``'s update, or None where there is
    no equivalence-tested one (exact classes only: a subclass may change the update)."""
    from tianshou.algorithm import DDPG, DQN, PPO, QRDQN, SAC, TD3
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.modelfree.qrdqn import QRDQNPolicy
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy, ProbabilisticActorPolicy
    from tianshou.algorithm.modelfree.sac import AutoAlpha, FixedAlpha, SACPolicy
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    kind = type(algorithm)
    policy = algorithm.policy
    if kind in (DQN, QRDQN):
        policy_class = DiscreteQLearningPolicy if kind is DQN else QRDQNPolicy
        if type(policy) is policy_class and type(policy.model) is Net:
            return _update(learns()[kind])
        return None
    if kind is PPO:
        actors, critics = (DiscreteActor, ContinuousActorProbabilistic), (DiscreteCritic, ContinuousCritic)
        if type(policy) in (ProbabilisticActorPolicy, DiscreteActorPolicy) and _on_nets(policy.actor, actors) \
                and _on_nets(algorithm.critic, critics):
            return _on_policy_update(learns()[kind])
        return None
    if kind not in (DDPG, TD3, SAC):
        return None
    critics = [algorithm.critic] + ([algorithm.critic2] if kind in (TD3, SAC) else [])
    if not all(_on_nets(c, (ContinuousCritic,)) for c in critics):
        return None
    if kind is SAC:
        if type(policy) is SACPolicy and _on_nets(policy.actor, (ContinuousActorProbabilistic,)) \
                and type(algorithm.alpha) in (FixedAlpha, AutoAlpha):
            return _update(learns()[kind])
        return None
    if type(policy) is ContinuousDeterministicPolicy and _on_nets(policy.actor, (ContinuousActorDeterministic,)):
        return _update(learns()[kind])
    return None


def learns() -> dict[type, Callable]:
    """The dispatch table: a Tianshou algorithm class → its family's fused learning step,
    ``learn(wrapper, algorithm, buffer, indices, weight, ...)``."""
    from tianshou.algorithm import DDPG, DQN, PPO, QRDQN, SAC, TD3

    return {DQN: value_based.dqn_learn, QRDQN: value_based.qrdqn_learn, DDPG: actor_critic.ddpg_learn,
            TD3: actor_critic.td3_learn, SAC: actor_critic.sac_learn, PPO: on_policy.ppo_learn}
