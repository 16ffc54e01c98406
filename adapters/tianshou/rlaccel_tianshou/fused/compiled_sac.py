"""Tianshou SAC's gradient step compiled whole (``training.compiled_updates: true``): both critics' steps, the
actor's, the entropy coefficient's and the Polyak average as one call (:mod:`rlaccel_plugins.fused.compiled_step`).

The math is :func:`~rlaccel_tianshou.fused.actor_critic.sac_learn`'s once its n-step returns are there (they
stay Tianshou's own ``_nstep_return`` on the host), in Tianshou's order: each critic's squared TD loss,
clip and Adam step; the actor's reparameterized sample (its Gaussian draw made before the call, where
Tianshou draws it: nothing draws in between), its loss through the *updated* critics with the coefficient
from before the step, clip and step; ``AutoAlpha``'s loss and step; then the Polyak average with
Tianshou's rounding. Networks are Tianshou's as layer data (:func:`~rlaccel_tianshou.flat_networks.critic_spec`,
:func:`~rlaccel_tianshou.flat_networks.probabilistic_actor_spec`).
"""

from __future__ import annotations

import torch

from rlaccel_plugins.fused.compiled_step import (
    AdamOperand,
    CompiledCall,
    adam_state_step,
    built,
    guard_of,
    run_steps_,
)
from rlaccel_plugins.fused.distributions import normal_log_prob
from rlaccel_plugins.fused.flat import apply_layers
from rlaccel_tianshou.flat_networks import (
    critic_spec,
    parameters_of,
    probabilistic_actor_apply,
    probabilistic_actor_spec,
)
from rlaccel_tianshou.fused.common import plain_step


class CompiledSACStep:
    """Tianshou SAC's gradient step compiled; :meth:`build` returns it or why it cannot be made."""

    def __init__(self, sac, actor_spec: tuple, critic_kinds: tuple, critic_params: list, compile: bool = True) -> None:
        from tianshou.algorithm.modelfree.sac import AutoAlpha

        self.sac = sac
        actor_kinds, actor_params = actor_spec
        optimizers = (sac.critic_optim, sac.critic2_optim, sac.policy_optim)
        self.operands = [AdamOperand(o._optim, params, max_grad_norm=o._max_grad_norm, guard=guard_of(o._optim))
                         for o, params in zip(optimizers, (*critic_params, actor_params))]
        self.tuned = type(sac.alpha) is AutoAlpha
        if self.tuned:
            self.operands.append(AdamOperand(sac.alpha._optim, [sac.alpha._log_alpha], guard=guard_of(sac.alpha._optim)))
        pairs = sac._lagged_networks._lagged_network_pairs
        self.targets = [p.detach() for pair in pairs for p in parameters_of(pair.target)]
        self.static = (actor_kinds, critic_kinds, self.tuned, float(sac.alpha._target_entropy) if self.tuned else 0.0,
                       float(sac.tau))
        self.call = CompiledCall(run_steps_, compile)

    @classmethod
    def build(cls, sac, compile: bool = True) -> CompiledSACStep | str:
        from tianshou.algorithm.modelfree.sac import AutoAlpha

        if next(sac.parameters()).device.type != "cpu":
            return "not on the CPU"
        actor, critics = probabilistic_actor_spec(sac.policy.actor), [critic_spec(c) for c in (sac.critic, sac.critic2)]
        if actor is None or None in critics or critics[0][0] != critics[1][0]:
            return "the actor or critics are not Tianshou's networks of Linear/ReLU/Tanh layers (or a hook is registered)"
        pairs = sac._lagged_networks._lagged_network_pairs
        if [pair.source for pair in pairs] != [sac.critic, sac.critic2]:
            return "the lagged networks are not the two critics'"
        if not all(plain_step(o) for o in (sac.critic_optim, sac.critic2_optim, sac.policy_optim)):
            return "an optimizer has a step of its own"
        optimizers = [o._optim for o in (sac.critic_optim, sac.critic2_optim, sac.policy_optim)]
        alpha = sac.alpha._optim if type(sac.alpha) is AutoAlpha else None
        return built(lambda: cls(sac, actor, critics[0][0], [critics[0][1], critics[1][1]], compile), [*optimizers, alpha])

    @property
    def failed(self) -> str | None:
        return self.call.failed

    @property
    def parameters(self) -> list[torch.Tensor]:
        """The trained parameters (a frozen one, on a dense step of the sparse/dense schedule, runs eagerly)."""
        return [p for operand in self.operands for p in operand._owners]

    def __call__(self, obs: torch.Tensor, act: torch.Tensor, returns: torch.Tensor, weight) -> tuple[torch.Tensor, ...]:
        """One step; returns the critics' losses, the actor's and (tuned) the coefficient's."""
        noise = torch.empty((len(obs), act.shape[1]), dtype=torch.float32).normal_()  # the actor's rsample draw
        alpha = torch.tensor(0.0 if self.tuned else self.sac.alpha.value, dtype=torch.float32)
        weighted = torch.is_tensor(weight)
        x = (obs, act, returns.flatten(), noise, weight if weighted else torch.ones(()), alpha)
        logged = self.call(_sac_body, [o.scan_tensors(1) for o in self.operands], [o.hyper for o in self.operands],
                           (*self.static, weighted), self.targets, x, False)
        for operand in self.operands:
            operand.stepped()
            operand.flush()
        return logged


def _squashed_gaussian(kinds: tuple, params: list, obs: torch.Tensor, noise: torch.Tensor) -> tuple:
    """:func:`~rlaccel_tianshou.fused.actor_critic._squashed_gaussian` with the draw given."""
    from tianshou.algorithm.modelfree.sac import correct_log_prob_gaussian_tanh

    loc, scale = probabilistic_actor_apply(kinds, params, obs)
    act = loc + noise * scale
    squashed = torch.tanh(act)
    log_prob = normal_log_prob(act, loc, scale)
    log_prob = log_prob.reshape(*log_prob.shape[:-1], -1).sum(-1)
    return squashed, correct_log_prob_gaussian_tanh(log_prob.unsqueeze(-1), squashed)


def _sac_body(static, states, targets, x):
    """One step for :func:`~rlaccel_plugins.fused.compiled_step.run_steps_` (states: both critics', the
    actor's, and the coefficient's where tuned)."""
    actor_kinds, critic_kinds, tuned, target_entropy, tau, weighted = static
    obs, act, returns, noise, weight, fixed_alpha = x
    critics, actor = states[:2], states[2]
    alpha = torch.exp(states[3][0][0]).detach() if tuned else fixed_alpha  # before its step, as Tianshou reads it

    def q_of(params, actions):
        return apply_layers(critic_kinds, params, torch.cat([obs.flatten(1), actions.flatten(1)], dim=1))

    def critic_loss_of(params):
        td = q_of(params, act).flatten() - returns
        loss = (td.pow(2) * weight).mean() if weighted else td.pow(2).mean()
        return loss, loss.detach()

    new_states, logged = [], []
    for critic in critics:
        grads, loss = torch.func.grad(critic_loss_of, has_aux=True)(critic[0])
        new_states.append(adam_state_step(grads, critic))
        logged.append(loss)
    updated = [[p.detach() for p in state[0]] for state in new_states]

    def actor_loss_of(params):
        act_pi, log_prob = _squashed_gaussian(actor_kinds, params, obs, noise)
        q = torch.min(q_of(updated[0], act_pi).flatten(), q_of(updated[1], act_pi).flatten())
        loss = (alpha * log_prob.flatten() - q).mean()
        return loss, (loss.detach(), log_prob.detach())

    grads, (actor_loss, log_prob) = torch.func.grad(actor_loss_of, has_aux=True)(actor[0])
    new_states.append(adam_state_step(grads, actor))
    logged.append(actor_loss)
    if tuned:
        entropy_deficit = target_entropy - (-log_prob)  # AutoAlpha.update(-log_prob), in its op order

        def alpha_loss_of(params):
            loss = -(params[0] * entropy_deficit).mean()
            return loss, loss.detach()

        grads, alpha_loss = torch.func.grad(alpha_loss_of, has_aux=True)(states[3][0])
        new_states.append(adam_state_step(grads, states[3]))
        logged.append(alpha_loss)
    sources = [p for state in new_states[:2] for p in state[0]]
    with torch.no_grad():  # Tianshou's polyak_parameter_update: both products rounded, then summed
        targets = [t * (1 - tau) + p * tau for t, p in zip(targets, sources)]
    return new_states, targets, tuple(logged)


def compiled_sac_step(sac, compile: bool = True) -> CompiledSACStep | str:
    """SAC's gradient step compiled whole, or why it cannot be (the registry's ``compiled`` builder)."""
    return CompiledSACStep.build(sac, compile)
