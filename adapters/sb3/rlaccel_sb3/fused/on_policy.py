"""Fused ``train()`` of the on-policy algorithms: PPO and A2C, SB3's own line for line with the
multi-tensor optimizer, the lean ``evaluate_actions`` and the rollout gathered once per field; and PPO's
epoch as one compiled call (``training.compiled_updates``: :func:`compiled_ppo_step`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from stable_baselines3.common.utils import explained_variance

from rlaccel_plugins.fused import OptimizerKernels, optimizer_step, zero_grad
from rlaccel_plugins.fused.compiled_step import CompiledStep, guard_of, ineligible
from rlaccel_plugins.fused.flat import apply_layers
from rlaccel_plugins.fused.kernels import clip_grad_norm
from rlaccel_plugins.fused.module_cache import parameters as module_parameters
from rlaccel_sb3 import flat_actor_critic as flat
from rlaccel_sb3.flat_actor_critic import evaluate_actions_of
from rlaccel_sb3.fused.common import GraphsPerModel, compiled_steps, mean_of
from rlaccel_sb3.rollout_batches import epoch_stacks, rollout_batches, rollout_epoch
from rlaccel_sb3.training_mode import set_training_mode


def _a2c_train(model, fused_optimizer: bool = False, compiled_of: Callable | None = None) -> None:
    """SB3's ``A2C.train`` (one gradient step on the whole rollout), line for line, with the policy's
    train-mode flags written flat, its ``evaluate_actions`` as the same tensor ops without module calls
    where the policy is an MLP one (``rlaccel_sb3.flat_actor_critic.lean_evaluate_actions_for``), the parameter
    list made once, and the optimizer's step as flat ops where :mod:`rlaccel_plugins.fused.flat_optim`
    covers it (SB3's ``RMSprop``), and the rollout's batch gathered with one copy per field
    (:mod:`rlaccel_sb3.rollout_batches`). ``compiled_of()``: the call's compiled step
    (:func:`compiled_a2c_step`), or None; it runs where the rollout is SB3's ``RolloutBuffer`` and no layer
    is frozen."""
    policy = model.policy
    evaluate_actions = evaluate_actions_of(model)
    set_training_mode(policy, True)
    model._update_learning_rate(policy.optimizer)
    compiled = compiled_of() if compiled_of is not None else None
    rows = model.rollout_buffer.buffer_size * model.rollout_buffer.n_envs
    if compiled is not None and epoch_stacks(model.rollout_buffer, rows) \
            and all(p.requires_grad for p in module_parameters(policy)):
        batch = rollout_epoch(model.rollout_buffer, rows)  # the one batch: the whole rollout, SB3's permutation
        policy_loss, value_loss, entropy_loss, _ = compiled(*(field[0] for field in batch)).unbind()
        compiled.flush()
    else:
        with OptimizerKernels([policy.optimizer], fused=fused_optimizer):
            for rollout_data in rollout_batches(model.rollout_buffer, None):  # one batch: the whole rollout
                actions = rollout_data.actions
                if isinstance(model.action_space, spaces.Discrete):
                    actions = actions.long().flatten()
                values, log_prob, entropy = evaluate_actions(rollout_data.observations, actions)
                loss, policy_loss, value_loss, entropy_loss = a2c_losses(
                    values.flatten(), log_prob, entropy, rollout_data, model.normalize_advantage, model.ent_coef,
                    model.vf_coef)
                zero_grad(policy.optimizer)
                loss.backward()
                clip_grad_norm(module_parameters(policy), model.max_grad_norm)
                optimizer_step(policy.optimizer)
    explained_var = explained_variance(model.rollout_buffer.values.flatten(), model.rollout_buffer.returns.flatten())
    model._n_updates += 1
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model.logger.record("train/explained_variance", explained_var)
    model.logger.record("train/entropy_loss", entropy_loss.item())
    model.logger.record("train/policy_loss", policy_loss.item())
    model.logger.record("train/value_loss", value_loss.item())
    if hasattr(policy, "log_std"):
        model.logger.record("train/std", torch.exp(policy.log_std).mean().item())


def a2c_losses(values: torch.Tensor, log_prob: torch.Tensor, entropy: torch.Tensor | None, batch,
               normalize_advantage: bool, ent_coef: float, vf_coef: float) -> tuple[torch.Tensor, ...]:
    """SB3's A2C loss on the rollout (``batch``: its ``RolloutBufferSamples``), in its op order: ``(loss,
    policy loss, value loss, entropy loss)``."""
    advantages = batch.advantages
    if normalize_advantage:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -(advantages * log_prob).mean()
    value_loss = F.mse_loss(batch.returns, values)
    entropy_loss = -torch.mean(-log_prob) if entropy is None else -torch.mean(entropy)
    loss = policy_loss + ent_coef * entropy_loss + vf_coef * value_loss
    return loss, policy_loss, value_loss, entropy_loss


def _ppo_train(model, fused_optimizer: bool = False, compiled_of: Callable | None = None) -> None:
    """SB3's ``PPO.train`` with the multi-tensor optimizer and clipping, the policy's ``evaluate_actions``
    as the same tensor ops without module calls or distribution objects where the policy is an MLP one
    (``rlaccel_sb3.flat_actor_critic.lean_evaluate_actions_for``), the minibatches gathered with one copy per
    field (:mod:`rlaccel_sb3.rollout_batches`), and the logged values gathered as tensors
    (one host sync per call; per minibatch only when ``target_kl`` needs the KL to decide).
    ``compiled_of()``: the call's compiled step (:func:`compiled_ppo_step`), or None; where the call's steps
    can run as one compiled loop (:func:`_loops`) they do, else its minibatches run eagerly."""
    policy = model.policy
    evaluate_actions = evaluate_actions_of(model)
    set_training_mode(policy, True)
    model._update_learning_rate(policy.optimizer)
    clip_range = model.clip_range(model._current_progress_remaining)
    clip_range_vf = model.clip_range_vf(model._current_progress_remaining) if model.clip_range_vf is not None else None
    clips = (1 - clip_range, 1 + clip_range, clip_range, clip_range_vf)
    entropy_losses, pg_losses, value_losses, clip_fractions = [], [], [], []
    approx_kl_divs: list = []
    parameters = module_parameters(policy)
    compiled = compiled_of() if compiled_of is not None else None
    loss = None
    continue_training = True
    looped = compiled is not None and _loops(model, compiled, parameters)
    if looped:  # every epoch's minibatch steps as one compiled loop
        logged = compiled.steps(*_loop_inputs(model, clips))  # per minibatch: PPO_LOGGED
        for values, column in zip((pg_losses, clip_fractions, value_losses, entropy_losses), logged[:, :4].T):
            values.extend(column.unbind())
        approx_kl_divs = list(logged[-(len(logged) // model.n_epochs):, 4].unbind())  # the last epoch's, as SB3 logs
        loss = logged[-1, 5]
        model._n_updates += model.n_epochs
    with OptimizerKernels([policy.optimizer], fused=fused_optimizer):
        for epoch in range(0 if looped else model.n_epochs):
            approx_kl_divs = []
            for rollout_data in rollout_batches(model.rollout_buffer, model.batch_size):
                actions = rollout_data.actions
                if isinstance(model.action_space, spaces.Discrete):
                    actions = rollout_data.actions.long().flatten()
                values, log_prob, entropy = evaluate_actions(rollout_data.observations, actions)
                loss, policy_loss, clip_fraction, value_loss, entropy_loss, approx_kl = ppo_losses(
                    values.flatten(), log_prob, entropy, rollout_data, clips, model.normalize_advantage,
                    model.ent_coef, model.vf_coef)
                pg_losses.append(policy_loss.detach())
                clip_fractions.append(clip_fraction)
                value_losses.append(value_loss.detach())
                entropy_losses.append(entropy_loss.detach())
                approx_kl_divs.append(approx_kl)
                if model.target_kl is not None:
                    approx_kl_div = approx_kl_divs[-1].cpu().numpy()
                    if approx_kl_div > 1.5 * model.target_kl:
                        continue_training = False
                        if model.verbose >= 1:
                            print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div:.2f}")
                        break
                zero_grad(policy.optimizer)
                loss.backward()
                clip_grad_norm(parameters, model.max_grad_norm)
                optimizer_step(policy.optimizer)
            model._n_updates += 1
            if not continue_training:
                break
    if compiled is not None:
        compiled.flush()
    explained_var = explained_variance(model.rollout_buffer.values.flatten(), model.rollout_buffer.returns.flatten())
    model.logger.record("train/entropy_loss", mean_of(entropy_losses))
    model.logger.record("train/policy_gradient_loss", mean_of(pg_losses))
    model.logger.record("train/value_loss", mean_of(value_losses))
    model.logger.record("train/approx_kl", np.mean(torch.stack(approx_kl_divs).cpu().numpy()) if approx_kl_divs
                        else np.mean([]))
    model.logger.record("train/clip_fraction", mean_of(clip_fractions))
    model.logger.record("train/loss", loss.item())
    model.logger.record("train/explained_variance", explained_var)
    if hasattr(policy, "log_std"):
        model.logger.record("train/std", torch.exp(policy.log_std).mean().item())
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model.logger.record("train/clip_range", clip_range)
    if clip_range_vf is not None:
        model.logger.record("train/clip_range_vf", clip_range_vf)


def ppo_losses(values: torch.Tensor, log_prob: torch.Tensor, entropy: torch.Tensor | None, batch, clips: tuple,
               normalize_advantage: bool, ent_coef: float, vf_coef: float) -> tuple[torch.Tensor, ...]:
    """SB3's PPO loss on one minibatch (``batch``: its ``RolloutBufferSamples``), in its op order: ``(loss,
    policy loss, clip fraction, value loss, entropy loss, approximate KL)``. ``clips``: ``(1 - clip_range,
    1 + clip_range, clip_range, clip_range_vf or None)``, as floats (the eager update) or 0-d float32
    tensors of the same values (the compiled one: a schedule's next value is not a new compilation)."""
    low, high, clip_range, clip_range_vf = clips
    advantages = batch.advantages
    if normalize_advantage and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = torch.exp(log_prob - batch.old_log_prob)
    policy_loss_1 = advantages * ratio
    policy_loss_2 = advantages * torch.clamp(ratio, low, high)
    policy_loss = -torch.min(policy_loss_1, policy_loss_2).mean()
    clip_fraction = torch.mean((torch.abs(ratio - 1) > clip_range).float())
    if clip_range_vf is None:
        values_pred = values
    else:
        values_pred = batch.old_values + torch.clamp(values - batch.old_values, -clip_range_vf, clip_range_vf)
    value_loss = F.mse_loss(batch.returns, values_pred)
    entropy_loss = -torch.mean(-log_prob) if entropy is None else -torch.mean(entropy)
    loss = policy_loss + ent_coef * entropy_loss + vf_coef * value_loss
    with torch.no_grad():
        log_ratio = log_prob - batch.old_log_prob
        approx_kl = torch.mean((torch.exp(log_ratio) - 1) - log_ratio)
    return loss, policy_loss, clip_fraction, value_loss, entropy_loss, approx_kl


# what a compiled PPO step logs per minibatch, in this order
PPO_LOGGED = ("policy_loss", "clip_fraction", "value_loss", "entropy_loss", "approx_kl", "loss")


def _loops(model, compiled: CompiledStep, parameters: list) -> bool:
    """Whether a ``train()`` call's steps run as one compiled loop: no ``target_kl`` (its check reads the KL on
    the host before each step), minibatches of one size from SB3's ``RolloutBuffer``, no layer frozen now or
    by a hook between the steps."""
    return model.target_kl is None and epoch_stacks(model.rollout_buffer, model.batch_size) \
        and compiled.can_loop() and all(p.requires_grad for p in parameters)


def _loop_inputs(model, clips: tuple) -> tuple:
    """Every epoch's minibatches, in SB3's order, as a compiled loop reads them (:func:`_ppo_compiled_loss`'s
    inputs, stacked): each epoch's permutation drawn as SB3 draws it (nothing else draws between them)."""
    epochs = [rollout_epoch(model.rollout_buffer, model.batch_size) for _ in range(model.n_epochs)]
    fields = [torch.cat(field) for field in zip(*epochs)]
    low, high, clip_range, clip_range_vf = clips
    row = torch.tensor([low, high, clip_range, 0.0 if clip_range_vf is None else clip_range_vf], dtype=torch.float32)
    return (*fields, row.expand(len(fields[0]), 4))


def _evaluated(params: list[torch.Tensor], spec: tuple, observations: torch.Tensor, actions: torch.Tensor):
    """SB3's ``evaluate_actions`` on :func:`~rlaccel_sb3.flat_actor_critic.actor_critic_spec`'s layers, as a pure
    function of the policy's parameters (the optimizer's order): values, log-probabilities, entropies."""
    actor_kinds, critic_kinds, actor_index, critic_index, log_std_index = spec
    features = observations.float()
    out = apply_layers(actor_kinds, [params[i] for i in actor_index], features)
    if log_std_index is None:
        log_prob, entropy = flat.categorical_log_prob_entropy(out, actions.long().flatten())
    else:
        log_prob, entropy = flat.gaussian_log_prob_entropy(out, params[log_std_index], actions)
    values = apply_layers(critic_kinds, [params[i] for i in critic_index], features).flatten()
    return values, log_prob, entropy


def _ppo_compiled_loss(params: list[torch.Tensor], spec: tuple, constants: tuple, observations: torch.Tensor,
                       actions: torch.Tensor, old_values: torch.Tensor, old_log_prob: torch.Tensor,
                       advantages: torch.Tensor, returns: torch.Tensor, clips: torch.Tensor):
    """:func:`_evaluated` then :func:`ppo_losses` for one minibatch (a compiled step's ``loss_of``)."""
    normalize_advantage, ent_coef, vf_coef, clip_values = constants
    values, log_prob, entropy = _evaluated(params, spec, observations, actions)
    batch = RolloutBufferSamples(observations, actions, old_values, old_log_prob, advantages, returns)
    losses = ppo_losses(values, log_prob, entropy, batch, (clips[0], clips[1], clips[2], clips[3] if clip_values else None),
                        normalize_advantage, ent_coef, vf_coef)
    return losses[0], torch.stack([losses[1], losses[2], losses[3], losses[4], losses[5], losses[0]]).detach()


def _a2c_compiled_loss(params: list[torch.Tensor], spec: tuple, constants: tuple, observations: torch.Tensor,
                       actions: torch.Tensor, old_values: torch.Tensor, old_log_prob: torch.Tensor,
                       advantages: torch.Tensor, returns: torch.Tensor):
    """:func:`_evaluated` then :func:`a2c_losses` for the rollout: logged policy, value, entropy loss and loss."""
    values, log_prob, entropy = _evaluated(params, spec, observations, actions)
    batch = RolloutBufferSamples(observations, actions, old_values, old_log_prob, advantages, returns)
    loss, policy_loss, value_loss, entropy_loss = a2c_losses(values, log_prob, entropy, batch, *constants)
    return loss, torch.stack([policy_loss, value_loss, entropy_loss, loss]).detach()


def compiled_ppo_step(model, compile: bool = True) -> CompiledStep | str:
    """PPO's minibatch step compiled whole — ``evaluate_actions``, the loss, SB3's clip and Adam's update — every
    epoch's minibatches of a ``train()`` call as one loop (:meth:`~rlaccel_plugins.fused.compiled_step.CompiledStep.steps`),
    or why it cannot be."""
    constants = (bool(model.normalize_advantage), float(model.ent_coef), float(model.vf_coef),
                 model.clip_range_vf is not None)
    return _compiled_on_policy_step(model, _ppo_compiled_loss, constants, compile)


def compiled_a2c_step(model, compile: bool = True) -> CompiledStep | str:
    """A2C's step on the rollout compiled whole — ``evaluate_actions``, the loss, SB3's clip and the optimizer's
    update (``RMSprop``, SB3's default, or ``Adam``) — or why it cannot be."""
    constants = (bool(model.normalize_advantage), float(model.ent_coef), float(model.vf_coef))
    return _compiled_on_policy_step(model, _a2c_compiled_loss, constants, compile)


def _compiled_on_policy_step(model, loss_of: Callable, constants: tuple, compile: bool) -> CompiledStep | str:
    """An on-policy algorithm's compiled step: ``loss_of(params, spec, constants, *rollout fields)`` on the MLP
    policy (:func:`_evaluated`'s ``spec``), or why it cannot be."""
    optimizer = model.policy.optimizer
    if model.device.type != "cpu":
        return "not on the CPU"
    spec = flat.actor_critic_spec(model)
    if spec is None:
        return ("the policy is not an MlpPolicy of Linear/ReLU/Tanh layers on a 1-D Box with Categorical or "
                "diagonal Gaussian actions (or gSDE, or a hook)")
    actor_kinds, critic_kinds, actor_params, critic_params, categorical = spec
    params = [p for g in optimizer.param_groups for p in g["params"]]
    index = {id(p): i for i, p in enumerate(params)}
    log_std = [] if categorical else [model.policy.log_std]
    if sorted(index) != sorted(id(p) for p in (*actor_params, *critic_params, *log_std)):
        return "the optimizer does not hold exactly the policy's parameters"
    guard = guard_of(optimizer)
    reason = ineligible(optimizer, guard)
    if reason is not None:
        return reason
    layers = (actor_kinds, critic_kinds, tuple(index[id(p)] for p in actor_params),
              tuple(index[id(p)] for p in critic_params), None if categorical else index[id(log_std[0])])
    return CompiledStep(loss_of, params, optimizer, static=(layers, constants), max_grad_norm=model.max_grad_norm,
                        guard=guard, compile=compile)


def ppo_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[[], None]:
    compiled_of = compiled_steps(model, graphs)

    def train() -> None:
        _ppo_train(model, fused_optimizer, compiled_of)
    return train


def a2c_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[[], None]:
    compiled_of = compiled_steps(model, graphs)

    def train() -> None:
        _a2c_train(model, fused_optimizer, compiled_of)
    return train
