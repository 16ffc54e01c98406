"""SAC's gradient step compiled whole (``training.compiled_updates``): the entropy coefficient's, the
critic's and the actor's updates and the target networks' Polyak average, as one call
(:mod:`rlaccel_plugins.fused.compiled_step`).

The math is SB3's ``SAC.train`` step, in its order: the actor's sample on the observations, the entropy
coefficient's loss and Adam step (the coefficient used below is the one before that step), the target
from the target critics on the actor's sample for the next observations, the critics' loss and step, the
actor's loss through the *updated* critics and its step, then the Polyak average where SB3 makes it. The
two Gaussian draws are made before the call, in SB3's order and shapes (the same ``normal_`` draws from
torch's generator), and passed in. Networks are SB3's ``MlpPolicy`` ones as layer data
(:func:`~rlaccel_sb3.flat_actor_critic.sac_actor_spec`, :func:`~rlaccel_sb3.flat_actor_critic.critic_spec`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlaccel_plugins.fused.compiled_step import (
    AdamOperand,
    CompiledCall,
    adam_state_step,
    built,
    guard_of,
    polyak,
    run_steps_,
    selected,
)
from rlaccel_plugins.fused.flat import apply_layers
from rlaccel_sb3 import flat_actor_critic as flat


class CompiledSACStep:
    """SAC's gradient steps compiled: one per call, or a ``train()`` call's steps as one loop
    (:meth:`steps`); ``build`` returns it or why it cannot be made."""

    def __init__(self, model, actor_spec, critic_spec, target_spec, compile: bool = True) -> None:
        self.model = model
        latent_kinds, actor_params, epsilon = actor_spec
        kinds, critic_params, n_critics = critic_spec
        self.static = (latent_kinds, kinds, n_critics, float(epsilon))
        self.targets = [p.detach() for p in target_spec[1]]
        self.actor = AdamOperand(model.actor.optimizer, actor_params, guard=guard_of(model.actor.optimizer))
        self.critic = AdamOperand(model.critic.optimizer, critic_params, guard=guard_of(model.critic.optimizer))
        tuned = model.ent_coef_optimizer is not None and model.log_ent_coef is not None
        self.ent = AdamOperand(model.ent_coef_optimizer, [model.log_ent_coef],
                               guard=guard_of(model.ent_coef_optimizer)) if tuned else None
        self.call = CompiledCall(run_steps_, compile)

    @classmethod
    def build(cls, model, compile: bool = True) -> CompiledSACStep | str:
        if model.device.type != "cpu":
            return "not on the CPU (CUDA graphs run there)"
        actor, critic, target = (flat.sac_actor_spec(model.actor), flat.critic_spec(model.critic),
                                 flat.critic_spec(model.critic_target))
        if actor is None or critic is None or target is None:
            return "the actor or critics are not MLPs of Linear/ReLU/Tanh layers on a 1-D Box (or gSDE, or a hook)"
        if model.batch_norm_stats:
            return "batch normalisation statistics"
        return built(lambda: cls(model, actor, critic, target, compile),
                     (model.actor.optimizer, model.critic.optimizer, model.ent_coef_optimizer))

    @property
    def failed(self) -> str | None:
        return self.call.failed

    @property
    def operands(self) -> list[AdamOperand]:
        return [o for o in (self.ent, self.critic, self.actor) if o is not None]

    def can_loop(self, steps: int) -> bool:
        """Whether :meth:`steps` may run ``steps`` steps (any number: the optimizers' post-hooks can wait until
        the loop's end)."""
        return all(o.hooks_can_wait() for o in self.operands)

    def __call__(self, observations, actions, next_observations, rewards, dones, discounts, weights=None, *,
                 update_target: bool) -> tuple[torch.Tensor, ...]:
        """The step's logged values: (entropy coefficient loss if tuned,) entropy coefficient, critic loss,
        actor loss."""
        shape = (len(actions), actions.shape[1])
        noise = (torch.empty(shape, dtype=torch.float32).normal_(),  # SB3's two draws, in its order
                 torch.empty(shape, dtype=torch.float32).normal_())
        if not torch.is_tensor(discounts):
            discounts = torch.tensor(float(discounts))
        x = (observations, actions, next_observations, rewards, dones, discounts, *noise,
             weights if weights is not None else torch.ones(()))
        return self._run(x, weights is not None, update_target, steps=1, loop=False)

    def steps(self, observations, actions, next_observations, rewards, dones, discounts, weights=None, *,
              update_target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``len(actions)`` steps as one compiled loop: row ``j`` of each input (and of ``update_target``, a
        bool per step) is step ``j``'s. Returns :meth:`__call__`'s values, one row per step. Only where
        :meth:`can_loop`."""
        k, shape = len(actions), (actions.shape[1], actions.shape[2])
        noise = torch.empty((k, 2, *shape), dtype=torch.float32)
        for j in range(k):  # SB3's two draws per step, in its order and shapes
            noise[j, 0].normal_()
            noise[j, 1].normal_()
        x = (observations, actions, next_observations, rewards, dones, discounts, noise[:, 0], noise[:, 1],
             weights if weights is not None else torch.ones((k,)))
        if bool(update_target.all()) or not bool(update_target.any()):  # the same every step: no select per step
            return self._run(x, weights is not None, bool(update_target[0]), steps=k, loop=True)
        return self._run((*x, update_target), weights is not None, None, steps=k, loop=True)

    def _run(self, x: tuple, weighted: bool, update_target: bool | None, steps: int,
             loop: bool) -> tuple[torch.Tensor, ...]:
        """``update_target``: whether the step(s) update the target critics; None: ``x``'s last rows say."""
        model = self.model
        tuned = self.ent is not None
        fixed = None if tuned else model.ent_coef_tensor.detach().reshape(())
        static = (*self.static, tuned, float(model.tau), float(model.target_entropy) if tuned else 0.0, weighted,
                  fixed, update_target)
        operands = self.operands
        outputs = self.call(_sac_body, [o.scan_tensors(steps) for o in operands], [o.hyper for o in operands],
                            static, self.targets, x, loop)
        for operand in operands:
            operand.stepped(steps)
        return outputs

    def flush(self) -> None:
        for operand in self.operands:
            operand.flush()


def _actor_sample(latent_kinds, params, observations, noise, epsilon):
    """SB3's ``Actor.action_log_prob`` with the Gaussian draw given: squashed actions and log-probabilities."""
    latent = apply_layers(latent_kinds, params[:-4], observations.float())
    mean = F.linear(latent, params[-4], params[-3])
    return flat.squashed_gaussian(mean, F.linear(latent, params[-2], params[-1]), noise, epsilon)


def _critics(kinds, params, n_critics, observations, actions):
    q_input = torch.cat([observations.float(), actions], dim=1)
    per = len(params) // n_critics
    return [apply_layers(kinds, params[i * per:(i + 1) * per], q_input) for i in range(n_critics)]


def _sac_body(static, states, targets, x):
    """One SAC step for :func:`~rlaccel_plugins.fused.compiled_step.run_steps_` (states: the entropy
    coefficient's if tuned, the critics', the actor's)."""
    latent_kinds, kinds, n_critics, epsilon, tuned, tau, target_entropy, weighted, fixed_ent_coef, update_target = static
    observations, actions, next_observations, rewards, dones, discounts, noise, next_noise, weights = x[:9]
    if update_target is None:  # per step, in a loop
        update_target = x[9]
    ent, critic, actor = states if tuned else (None, *states)
    with torch.no_grad():
        _, log_prob = _actor_sample(latent_kinds, actor[0], observations, noise, epsilon)
        log_prob = log_prob.reshape(-1, 1)
    outputs = []
    if ent is not None:
        ent_coef = torch.exp(ent[0][0]).detach()  # before its step, as SB3 reads it

        def ent_coef_loss_of(params):
            loss = flat.ent_coef_loss(params[0], log_prob, target_entropy)
            return loss, loss.detach()

        grads, ent_coef_loss = torch.func.grad(ent_coef_loss_of, has_aux=True)(ent[0])
        ent = adam_state_step(grads, ent)
        outputs.append(ent_coef_loss)
    else:
        ent_coef = fixed_ent_coef
    outputs.append(ent_coef.reshape(()))
    with torch.no_grad():
        next_actions, next_log_prob = _actor_sample(latent_kinds, actor[0], next_observations, next_noise, epsilon)
        target = flat.critics_target(_critics(kinds, targets, n_critics, next_observations, next_actions), rewards,
                                     dones, discounts, ent_coef * next_log_prob.reshape(-1, 1))

    def critic_loss_of(params):
        current = _critics(kinds, params, n_critics, observations, actions)
        loss, differentiated = flat.critic_losses(current, target, weights if weighted else None)
        return 0.5 * differentiated, (0.5 * loss).detach()

    grads, critic_loss = torch.func.grad(critic_loss_of, has_aux=True)(critic[0])
    critic = adam_state_step(grads, critic)
    updated_critic = [p.detach() for p in critic[0]]

    def actor_loss_of(params):
        actions_pi, log_prob_pi = _actor_sample(latent_kinds, params, observations, noise, epsilon)
        loss = flat.sac_actor_loss(_critics(kinds, updated_critic, n_critics, observations, actions_pi),
                                   log_prob_pi.reshape(-1, 1), ent_coef)
        return loss, loss.detach()

    grads, actor_loss = torch.func.grad(actor_loss_of, has_aux=True)(actor[0])
    actor = adam_state_step(grads, actor)
    targets = selected(update_target, lambda: polyak(targets, critic[0], tau), targets)
    states = [critic, actor] if ent is None else [ent, critic, actor]
    return states, targets, (*outputs, critic_loss, actor_loss)
