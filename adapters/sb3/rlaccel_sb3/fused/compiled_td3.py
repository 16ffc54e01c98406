"""TD3's (and DDPG's) gradient step compiled whole (``training.compiled_updates``): the critics' update and,
every ``policy_delay`` steps, the actor's update and the target networks' Polyak averages, as one call
(:mod:`rlaccel_plugins.fused.compiled_step`).

The math is SB3's ``TD3.train`` step, in its order: the target policy's smoothing noise (drawn before the
call, as SB3 draws it: ``actions.clone().normal_(0, target_policy_noise)``, then clipped), the target from
the target actor and target critics, the critics' loss and step, then — on an actor step — the actor's
loss through the first *updated* critic, its step, and the critics' then the actor's Polyak average.
Networks are SB3's ``MlpPolicy`` ones as layer data (:func:`~rlaccel_sb3.flat_actor_critic.td3_actor_spec`,
:func:`~rlaccel_sb3.flat_actor_critic.critic_spec`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlaccel_plugins.fused.compiled_step import AdamOperand, CompiledCall, adam_update_, guard_of, ineligible
from rlaccel_plugins.fused.flat import apply_layers
from rlaccel_sb3 import flat_actor_critic as flat
from rlaccel_sb3.fused.compiled_sac import _critics


class CompiledTD3Step:
    """One TD3 gradient step per call, compiled; ``build`` returns it or why it cannot be made."""

    def __init__(self, model, actor_spec, critic_spec, actor_target_spec, critic_target_spec,
                 compile: bool = True) -> None:
        self.model = model
        actor_kinds, actor_params = actor_spec
        kinds, critic_params, n_critics = critic_spec
        self.static = (actor_kinds, kinds, n_critics)
        self.targets = ([p.detach() for p in critic_target_spec[1]], [p.detach() for p in actor_target_spec[1]])
        self.critic = AdamOperand(model.critic.optimizer, critic_params, guard=guard_of(model.critic.optimizer))
        self.actor = AdamOperand(model.actor.optimizer, actor_params, guard=guard_of(model.actor.optimizer))
        self.call = CompiledCall(_td3_step, compile)

    @classmethod
    def build(cls, model, compile: bool = True) -> CompiledTD3Step | str:
        if model.device.type != "cpu":
            return "not on the CPU (CUDA graphs run there)"
        actor, actor_target = flat.td3_actor_spec(model.actor), flat.td3_actor_spec(model.actor_target)
        critic, critic_target = flat.critic_spec(model.critic), flat.critic_spec(model.critic_target)
        if actor is None or actor_target is None or critic is None or critic_target is None:
            return "the actor or critics are not MLPs of Linear/ReLU/Tanh layers on a 1-D Box (or a hook)"
        if actor_target[0] != actor[0] or critic_target[0] != critic[0]:
            return "a target network is not its network's shape of MLP"
        if model.actor_batch_norm_stats or model.critic_batch_norm_stats:
            return "batch normalisation statistics"
        for optimizer in (model.actor.optimizer, model.critic.optimizer):
            reason = ineligible(optimizer, guard_of(optimizer))
            if reason is not None:
                return reason
        try:
            return cls(model, actor, critic, actor_target, critic_target, compile)
        except ValueError as error:  # an optimizer holding other parameters than the network's
            return str(error)

    @property
    def failed(self) -> str | None:
        return self.call.failed

    def __call__(self, observations, actions, next_observations, rewards, dones, discounts, weights=None, *,
                 update_actor: bool) -> tuple[torch.Tensor, ...]:
        """The step's logged values: the critics' loss (and the actor's, on an actor step)."""
        model = self.model
        noise = actions.clone().normal_(0, model.target_policy_noise)  # SB3's draw, its shape and order
        if not torch.is_tensor(discounts):
            discounts = torch.tensor(float(discounts))
        inputs = (observations, actions, next_observations, rewards, dones, discounts, noise,
                  weights if weights is not None else torch.ones(()))
        constants = (float(model.tau), float(model.target_noise_clip), update_actor, weights is not None)
        outputs = self.call(self.static, self.critic.tensors(), self.critic.hyper,
                            self.actor.tensors() if update_actor else None, self.actor.hyper, self.targets,
                            inputs, constants)
        self.critic.stepped()
        if update_actor:
            self.actor.stepped()
        return outputs

    def flush(self) -> None:
        self.critic.flush()
        self.actor.flush()


def _td3_step(static, critic, critic_hyper, actor, actor_hyper, targets, inputs, constants):
    actor_kinds, kinds, n_critics = static
    observations, actions, next_observations, rewards, dones, discounts, noise, weights = inputs
    tau, noise_clip, update_actor, weighted = constants
    critic_targets, actor_targets = targets
    with torch.no_grad():
        noise = noise.clamp(-noise_clip, noise_clip)
        next_actions = (apply_layers(actor_kinds, actor_targets, next_observations.float()) + noise).clamp(-1, 1)
        next_q = torch.cat(_critics(kinds, critic_targets, n_critics, next_observations, next_actions), dim=1)
        next_q, _ = torch.min(next_q, dim=1, keepdim=True)
        target = rewards + (1 - dones) * discounts * next_q

    def critic_loss_of(params):
        current = _critics(kinds, params, n_critics, observations, actions)
        loss = sum(F.mse_loss(q, target) for q in current)
        if not weighted:
            return loss, loss.detach()
        w = weights.view(-1, 1).to(target.dtype)
        return sum((w * (q - target) ** 2).mean() for q in current), loss.detach()

    grads, critic_loss = torch.func.grad(critic_loss_of, has_aux=True)(critic[0])
    adam_update_(grads, critic, critic_hyper)
    if not update_actor:
        return (critic_loss,)
    first_critic = [p.detach() for p in critic[0][:len(critic[0]) // n_critics]]

    def actor_loss_of(params):
        actions_pi = apply_layers(actor_kinds, params, observations.float())
        loss = -_critics(kinds, first_critic, 1, observations, actions_pi)[0].mean()  # SB3's q1_forward
        return loss, loss.detach()

    grads, actor_loss = torch.func.grad(actor_loss_of, has_aux=True)(actor[0])
    adam_update_(grads, actor, actor_hyper)
    with torch.no_grad():  # SB3's polyak_update: the critics', then the actor's; mul_, then add_
        for target_param, param in zip([*critic_targets, *actor_targets], [*critic[0], *actor[0]]):
            target_param.copy_(torch.add(target_param * (1 - tau), param, alpha=tau))
    return (critic_loss, actor_loss)
