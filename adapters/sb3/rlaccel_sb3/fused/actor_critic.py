"""Fused ``train()`` of the actor-critic algorithms: SAC, TD3 and DDPG (SB3's DDPG is TD3 with one critic
and no delay), with ``MlpPolicy`` networks as flat functions (:mod:`rlaccel_sb3.flat_actor_critic`)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from gymnasium import spaces

from rlaccel_plugins.fused import OptimizerKernels, zero_grad
from rlaccel_plugins.fused.kernels import backward_to
from rlaccel_plugins.fused.module_cache import new_epoch
from rlaccel_plugins.fused.module_cache import parameters as module_parameters
from rlaccel_sb3 import flat_actor_critic as flat
from rlaccel_sb3.fused.batches import Batches, iter_batches, step_of
from rlaccel_sb3.fused.common import GraphsPerModel, compiled_steps, mean_of, replay_loops, step_key
from rlaccel_sb3.training_mode import set_training_mode


def _td3_train(model, gradient_steps: int, batch_size: int, graphs: GraphsPerModel,
               fused_optimizer: bool = False, compiled_of: Callable | None = None) -> None:
    """SB3's ``TD3.train``; ``compiled_of()``: the call's :class:`CompiledTD3Step`, or None (eager steps)."""
    from rlaccel_plugins.fused import polyak_update_

    actor, critic = model.actor, model.critic
    set_training_mode(model.policy, True)
    optimizers = [actor.optimizer, critic.optimizer]
    model._update_learning_rate(optimizers)
    actor_losses, critic_losses = [], []
    if gradient_steps > 0:
        epoch = new_epoch()  # each network's tree is checked once per call
        critic_pairs = module_parameters(critic, epoch), module_parameters(model.critic_target, epoch)
        actor_pairs = module_parameters(actor, epoch), module_parameters(model.actor_target, epoch)
        parameters = [*critic_pairs[0], *actor_pairs[0]]
        actor_f, critic_f, q1_f = flat.actor_forward(actor, epoch), flat.critic_forward(critic, epoch), \
            flat.critic_q1(critic, epoch)
        target_actor_f, target_critic_f = (flat.actor_forward(model.actor_target, epoch),
                                           flat.critic_forward(model.critic_target, epoch))

        def step(observations, actions, next_observations, rewards, dones, discounts, weights=None, *,
                 update_actor: bool):
            with torch.no_grad():
                noise = actions.clone().data.normal_(0, model.target_policy_noise)
                next_actions = flat.smoothed_target_actions(target_actor_f(next_observations), noise,
                                                            model.target_noise_clip)
                target = flat.critics_target(target_critic_f(next_observations, next_actions), rewards, dones,
                                             discounts)
            critic_loss, weighted = flat.critic_losses(critic_f(observations, actions), target, weights)
            zero_grad(critic.optimizer)
            weighted.backward()
            steps.optimizer_step(critic.optimizer)
            if not update_actor:
                return (critic_loss.detach(),)
            actor_loss = -q1_f(observations, actor_f(observations)).mean()
            zero_grad(actor.optimizer)
            backward_to(actor_loss, actor.optimizer)  # not into the critic's weights: never applied
            steps.optimizer_step(actor.optimizer)
            polyak_update_(*critic_pairs, model.tau)
            polyak_update_(*actor_pairs, model.tau)
            polyak_update_(model.critic_batch_norm_stats, model.critic_batch_norm_stats_target, 1.0)
            polyak_update_(model.actor_batch_norm_stats, model.actor_batch_norm_stats_target, 1.0)
            return critic_loss.detach(), actor_loss.detach()

        steps = graphs.get(step, optimizers, isinstance(model.observation_space, spaces.Dict))
        compiled = compiled_of() if compiled_of is not None else None
        with OptimizerKernels(optimizers, fused=fused_optimizer):
            for batches, i in _each_step(model, gradient_steps, batch_size):
                if i == 0 and compiled is not None and replay_loops(model, compiled, batches.k, parameters):
                    critic, actor_steps = compiled.steps(*_stacked_inputs(model, batches))
                    model._n_updates += batches.k
                    critic_losses.extend(critic.unbind())
                    actor_losses.extend(actor_steps.unbind())
                    break
                model._n_updates += 1
                update_actor = model._n_updates % model.policy_delay == 0
                inputs = _actor_critic_inputs(model, batches, i)
                if compiled is not None and all(p.requires_grad for p in parameters):  # not a dense step
                    outputs = compiled(*inputs, update_actor=update_actor)
                else:
                    steps.step = functools.partial(step, update_actor=update_actor)
                    outputs = steps.run(step_key(steps, parameters, optimizers, inputs, update_actor), inputs)
                critic_losses.append(outputs[0])
                if update_actor:
                    actor_losses.append(outputs[1])
        graphs.finish(optimizers)
        if compiled is not None:
            compiled.flush()
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    if actor_losses:
        model.logger.record("train/actor_loss", mean_of(actor_losses))
    model.logger.record("train/critic_loss", mean_of(critic_losses) if critic_losses else np.nan)


def _each_step(model, gradient_steps: int, batch_size: int):
    """``(batches, i)`` for every gradient step: step ``i`` of the chunk ``batches``."""
    for batches in iter_batches(model, gradient_steps, batch_size):
        for i in range(batches.k):
            yield batches, i


def _stacked_inputs(model, batches: Batches) -> tuple:
    """:func:`_actor_critic_inputs` for every step of the chunk: row ``j`` of each is step ``j``'s."""
    discounts = batches.discounts if batches.discounts is not None else torch.full((batches.k,), float(model.gamma))
    inputs = (batches.observations, batches.actions, batches.next_observations, batches.rewards, batches.dones,
              discounts)
    return inputs + (batches.weights,) if batches.weights is not None else inputs


def _actor_critic_inputs(model, batches: Batches, i: int) -> tuple:
    """Step ``i``'s tensors, in the order the actor-critic step functions take them."""
    observations, actions = batches.step(i)
    discounts = batches.discounts[i] if batches.discounts is not None else model.gamma
    inputs = (observations, actions, step_of(batches.next_observations, i), batches.rewards[i], batches.dones[i],
              discounts)
    return inputs + (batches.weights[i],) if batches.weights is not None else inputs


def _sac_train(model, gradient_steps: int, batch_size: int, graphs: GraphsPerModel,
               fused_optimizer: bool = False, compiled_of: Callable | None = None) -> None:
    """SB3's ``SAC.train``; ``compiled_of()``: the call's :class:`CompiledSACStep`, or None (eager steps)."""
    from rlaccel_plugins.fused import polyak_update_

    actor, critic = model.actor, model.critic
    set_training_mode(model.policy, True)
    optimizers = [actor.optimizer, critic.optimizer]
    if model.ent_coef_optimizer is not None:
        optimizers += [model.ent_coef_optimizer]
    model._update_learning_rate(optimizers)
    ent_coef_losses, ent_coefs, actor_losses, critic_losses = [], [], [], []
    if gradient_steps > 0:
        epoch = new_epoch()  # each network's tree is checked once per call
        critic_pairs = module_parameters(critic, epoch), module_parameters(model.critic_target, epoch)
        parameters = [*critic_pairs[0], *module_parameters(actor, epoch)]
        sample_f, critic_f = flat.action_log_prob(actor, epoch), flat.critic_forward(critic, epoch)
        target_critic_f = flat.critic_forward(model.critic_target, epoch)
        tuned = model.ent_coef_optimizer is not None and model.log_ent_coef is not None

        def step(observations, actions, next_observations, rewards, dones, discounts, weights=None, *,
                 update_target: bool):
            if model.use_sde:
                actor.reset_noise()
            actions_pi, log_prob = sample_f(observations)
            log_prob = log_prob.reshape(-1, 1)
            outputs = ()
            if tuned:
                ent_coef = torch.exp(model.log_ent_coef.detach())
                ent_coef_loss = flat.ent_coef_loss(model.log_ent_coef, log_prob, model.target_entropy)
                outputs = (ent_coef_loss.detach(),)
                zero_grad(model.ent_coef_optimizer)
                ent_coef_loss.backward()
                steps.optimizer_step(model.ent_coef_optimizer)
            else:
                ent_coef = model.ent_coef_tensor
            outputs += (ent_coef.detach().reshape(()),)
            with torch.no_grad():
                next_actions, next_log_prob = sample_f(next_observations)
                target = flat.critics_target(target_critic_f(next_observations, next_actions), rewards, dones,
                                             discounts, ent_coef * next_log_prob.reshape(-1, 1))
            critic_loss, weighted = flat.critic_losses(critic_f(observations, actions), target, weights)
            critic_loss, weighted = 0.5 * critic_loss, 0.5 * weighted
            zero_grad(critic.optimizer)
            weighted.backward()
            steps.optimizer_step(critic.optimizer)
            actor_loss = flat.sac_actor_loss(critic_f(observations, actions_pi), log_prob, ent_coef)
            zero_grad(actor.optimizer)
            backward_to(actor_loss, actor.optimizer)  # not into the critics' weights: never applied
            steps.optimizer_step(actor.optimizer)
            if update_target:
                polyak_update_(*critic_pairs, model.tau)
                polyak_update_(model.batch_norm_stats, model.batch_norm_stats_target, 1.0)
            return (*outputs, critic_loss.detach(), actor_loss.detach())

        steps = graphs.get(step, optimizers, isinstance(model.observation_space, spaces.Dict))
        compiled = compiled_of() if compiled_of is not None else None
        with OptimizerKernels(optimizers, fused=fused_optimizer):
            for gradient_step, (batches, i) in enumerate(_each_step(model, gradient_steps, batch_size)):
                if i == 0 and compiled is not None and replay_loops(model, compiled, batches.k, parameters):
                    logged = compiled.steps(*_stacked_inputs(model, batches),
                                            update_target=torch.arange(batches.k) % model.target_update_interval == 0)
                    for values, rows in zip((ent_coef_losses, ent_coefs, critic_losses, actor_losses)[-len(logged):],
                                            logged):
                        values.extend(rows.unbind())
                    break
                update_target = gradient_step % model.target_update_interval == 0
                inputs = _actor_critic_inputs(model, batches, i)
                if compiled is not None and all(p.requires_grad for p in parameters):  # not a dense step
                    outputs = compiled(*inputs, update_target=update_target)
                else:
                    steps.step = functools.partial(step, update_target=update_target)
                    outputs = steps.run(step_key(steps, parameters, optimizers, inputs, update_target), inputs)
                if tuned:
                    ent_coef_losses.append(outputs[0])
                ent_coefs.append(outputs[-3])
                critic_losses.append(outputs[-2])
                actor_losses.append(outputs[-1])
        graphs.finish(optimizers)
        if compiled is not None:
            compiled.flush()
    model._n_updates += gradient_steps
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    nan = np.nan
    model.logger.record("train/ent_coef", mean_of(ent_coefs) if ent_coefs else nan)
    model.logger.record("train/actor_loss", mean_of(actor_losses) if actor_losses else nan)
    model.logger.record("train/critic_loss", mean_of(critic_losses) if critic_losses else nan)
    if ent_coef_losses:
        model.logger.record("train/ent_coef_loss", mean_of(ent_coef_losses))


def sac_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[..., None]:
    compiled_of = compiled_steps(model, graphs)

    def train(gradient_steps: int, batch_size: int = 100) -> None:
        _sac_train(model, gradient_steps, batch_size, graphs, fused_optimizer, compiled_of)
    return train


def td3_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[..., None]:
    """TD3's and DDPG's (SB3's ``DDPG`` inherits ``TD3.train``)."""
    compiled_of = compiled_steps(model, graphs)

    def train(gradient_steps: int, batch_size: int = 100) -> None:
        _td3_train(model, gradient_steps, batch_size, graphs, fused_optimizer, compiled_of)
    return train
