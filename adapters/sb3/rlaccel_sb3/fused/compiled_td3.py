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

from rlaccel_plugins.fused.compiled_step import (
    AdamOperand,
    CompiledCall,
    adam_state_step,
    built,
    guard_of,
    polyak,
    run_steps_,
)
from rlaccel_plugins.fused.flat import apply_layers
from rlaccel_sb3 import flat_actor_critic as flat
from rlaccel_sb3.fused.compiled_sac import _critics


class CompiledTD3Step:
    """TD3's gradient steps compiled: one per call, or a ``train()`` call's steps as one loop
    (:meth:`steps`); ``build`` returns it or why it cannot be made."""

    def __init__(self, model, actor_spec, critic_spec, actor_target_spec, critic_target_spec,
                 compile: bool = True) -> None:
        self.model = model
        actor_kinds, actor_params = actor_spec
        kinds, critic_params, n_critics = critic_spec
        self.static = (actor_kinds, kinds, n_critics)
        self.targets = [p.detach() for p in (*critic_target_spec[1], *actor_target_spec[1])]
        self.critic = AdamOperand(model.critic.optimizer, critic_params, guard=guard_of(model.critic.optimizer))
        self.actor = AdamOperand(model.actor.optimizer, actor_params, guard=guard_of(model.actor.optimizer))
        self.call = CompiledCall(run_steps_, compile)

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
        return built(lambda: cls(model, actor, critic, actor_target, critic_target, compile),
                     (model.actor.optimizer, model.critic.optimizer))

    @property
    def failed(self) -> str | None:
        return self.call.failed

    def can_loop(self, steps: int) -> bool:
        """Whether :meth:`steps` may run ``steps`` steps: a whole number of actor steps' periods
        (``policy_delay``), and the optimizers' post-hooks can wait until the loop's end."""
        return steps % self.model.policy_delay == 0 and self.critic.hooks_can_wait() and self.actor.hooks_can_wait()

    def __call__(self, observations, actions, next_observations, rewards, dones, discounts, weights=None, *,
                 update_actor: bool) -> tuple[torch.Tensor, ...]:
        """The step's logged values: the critics' loss (and the actor's, on an actor step)."""
        noise = actions.clone().normal_(0, self.model.target_policy_noise)  # SB3's draw, its shape and order
        if not torch.is_tensor(discounts):
            discounts = torch.tensor(float(discounts))
        x = tuple(t.unsqueeze(0) for t in (observations, actions, next_observations, rewards, dones, discounts,
                                           noise, weights if weights is not None else torch.ones(())))
        critic_losses, actor_loss = self._run(x, weights is not None, 1, 0 if update_actor else None, loop=False)
        return (critic_losses[0], actor_loss) if update_actor else (critic_losses[0],)

    def steps(self, observations, actions, next_observations, rewards, dones, discounts,
              weights=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``len(actions)`` steps, the model's next ones, as one compiled loop of ``policy_delay`` steps per
        turn (an actor step in each; nothing computed for the steps without one): row ``j`` of each input is
        step ``j``'s. Returns the critics' loss of every step and the actor's of every actor step. Only where
        :meth:`can_loop`."""
        model, k = self.model, len(actions)
        delay = model.policy_delay
        noise = torch.stack([actions[j].clone().normal_(0, model.target_policy_noise) for j in range(k)])
        rows = (observations, actions, next_observations, rewards, dones, discounts, noise,
                weights if weights is not None else torch.ones((k,)))
        x = tuple(t.reshape(k // delay, delay, *t.shape[1:]) for t in rows)
        actor_at = -(model._n_updates + 1) % delay  # SB3 steps the actor where _n_updates % policy_delay == 0
        critic_losses, actor_losses = self._run(x, weights is not None, k, actor_at, loop=True)
        return critic_losses.reshape(-1), actor_losses

    def _run(self, x: tuple, weighted: bool, steps: int, actor_at: int | None, loop: bool):
        model = self.model
        static = (*self.static, float(model.tau), float(model.target_noise_clip), weighted, len(x[0][0]) if loop
                  else 1, actor_at)
        operands = [self.critic, self.actor]
        outputs = self.call(_td3_body, [o.scan_tensors(steps) for o in operands], [o.hyper for o in operands],
                            static, self.targets, x, loop)
        self.critic.stepped(steps)
        actor_steps = steps // model.policy_delay if loop else int(actor_at is not None)
        self.actor.stepped(actor_steps)
        return outputs

    def flush(self) -> None:
        self.critic.flush()
        self.actor.flush()


def _td3_body(static, states, targets, x):
    """``group`` TD3 steps for :func:`~rlaccel_plugins.fused.compiled_step.run_steps_` (states: the critics',
    the actor's; ``targets``: the target critics' then the target actor's layers), the actor's step after
    step ``actor_at`` of them (None: no actor step). Row ``s`` of each input is step ``s``'s."""
    actor_kinds, kinds, n_critics, tau, noise_clip, weighted, group, actor_at = static
    critic, actor = states
    split = len(critic[0])
    critic_targets, actor_targets = targets[:split], targets[split:]
    critic_losses, actor_loss = [], None
    for s in range(group):
        observations, actions, next_observations, rewards, dones, discounts, noise, weights = (t[s] for t in x)
        with torch.no_grad():
            next_actions = flat.smoothed_target_actions(
                apply_layers(actor_kinds, actor_targets, next_observations.float()), noise, noise_clip)
            target = flat.critics_target(_critics(kinds, critic_targets, n_critics, next_observations, next_actions),
                                         rewards, dones, discounts)

        def critic_loss_of(params, observations=observations, actions=actions, target=target, weights=weights):
            current = _critics(kinds, params, n_critics, observations, actions)
            loss, differentiated = flat.critic_losses(current, target, weights if weighted else None)
            return differentiated, loss.detach()

        grads, critic_loss = torch.func.grad(critic_loss_of, has_aux=True)(critic[0])
        critic = adam_state_step(grads, critic)
        critic_losses.append(critic_loss)
        if s != actor_at:
            continue
        first_critic = [p.detach() for p in critic[0][:split // n_critics]]

        def actor_loss_of(params, observations=observations, first_critic=first_critic):
            actions_pi = apply_layers(actor_kinds, params, observations.float())
            loss = -_critics(kinds, first_critic, 1, observations, actions_pi)[0].mean()  # SB3's q1_forward
            return loss, loss.detach()

        grads, actor_loss = torch.func.grad(actor_loss_of, has_aux=True)(actor[0])
        actor = adam_state_step(grads, actor)
        # SB3's polyak_update: the critics', then the actor's
        critic_targets, actor_targets = polyak(critic_targets, critic[0], tau), polyak(actor_targets, actor[0], tau)
    logged = torch.stack(critic_losses), actor_loss if actor_loss is not None else torch.zeros(())
    return [critic, actor], [*critic_targets, *actor_targets], logged
