"""Fused ``train()`` of the on-policy algorithms: PPO and A2C, SB3's own line for line with the
multi-tensor optimizer, the lean ``evaluate_actions`` and the rollout gathered once per field."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.utils import explained_variance

from rlaccel_plugins.fused import OptimizerKernels, optimizer_step, zero_grad
from rlaccel_plugins.fused.kernels import clip_grad_norm
from rlaccel_plugins.fused.module_cache import parameters as module_parameters
from rlaccel_sb3.flat_actor_critic import evaluate_actions_of
from rlaccel_sb3.fused.common import GraphsPerModel, mean_of
from rlaccel_sb3.rollout_batches import rollout_batches
from rlaccel_sb3.training_mode import set_training_mode


def _a2c_train(model, fused_optimizer: bool = False) -> None:
    """SB3's ``A2C.train`` (one gradient step on the whole rollout), line for line, with the policy's
    train-mode flags written flat, its ``evaluate_actions`` as the same tensor ops without module calls
    where the policy is an MLP one (``rlaccel_sb3.flat_actor_critic.lean_evaluate_actions_for``), the parameter
    list made once, and the optimizer's step as flat ops where :mod:`rlaccel_plugins.fused.flat_optim`
    covers it (SB3's ``RMSprop``), and the rollout's batch gathered with one copy per field
    (:mod:`rlaccel_sb3.rollout_batches`)."""
    policy = model.policy
    evaluate_actions = evaluate_actions_of(model)
    set_training_mode(policy, True)
    model._update_learning_rate(policy.optimizer)
    with OptimizerKernels([policy.optimizer], fused=fused_optimizer):
        for rollout_data in rollout_batches(model.rollout_buffer, None):  # one batch: the whole rollout
            actions = rollout_data.actions
            if isinstance(model.action_space, spaces.Discrete):
                actions = actions.long().flatten()
            values, log_prob, entropy = evaluate_actions(rollout_data.observations, actions)
            values = values.flatten()
            advantages = rollout_data.advantages
            if model.normalize_advantage:
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            policy_loss = -(advantages * log_prob).mean()
            value_loss = F.mse_loss(rollout_data.returns, values)
            entropy_loss = -torch.mean(-log_prob) if entropy is None else -torch.mean(entropy)
            loss = policy_loss + model.ent_coef * entropy_loss + model.vf_coef * value_loss
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


def _ppo_train(model, fused_optimizer: bool = False) -> None:
    """SB3's ``PPO.train`` with the multi-tensor optimizer and clipping, the policy's ``evaluate_actions``
    as the same tensor ops without module calls or distribution objects where the policy is an MLP one
    (``rlaccel_sb3.flat_actor_critic.lean_evaluate_actions_for``), the minibatches gathered with one copy per
    field (:mod:`rlaccel_sb3.rollout_batches`), and the logged values gathered as tensors
    (one host sync per call; per minibatch only when ``target_kl`` needs the KL to decide)."""
    policy = model.policy
    evaluate_actions = evaluate_actions_of(model)
    set_training_mode(policy, True)
    model._update_learning_rate(policy.optimizer)
    clip_range = model.clip_range(model._current_progress_remaining)
    clip_range_vf = model.clip_range_vf(model._current_progress_remaining) if model.clip_range_vf is not None else None
    entropy_losses, pg_losses, value_losses, clip_fractions = [], [], [], []
    approx_kl_divs: list = []
    parameters = module_parameters(policy)
    loss = None
    continue_training = True
    with OptimizerKernels([policy.optimizer], fused=fused_optimizer):
        for epoch in range(model.n_epochs):
            approx_kl_divs = []
            for rollout_data in rollout_batches(model.rollout_buffer, model.batch_size):
                actions = rollout_data.actions
                if isinstance(model.action_space, spaces.Discrete):
                    actions = rollout_data.actions.long().flatten()
                values, log_prob, entropy = evaluate_actions(rollout_data.observations, actions)
                values = values.flatten()
                advantages = rollout_data.advantages
                if model.normalize_advantage and len(advantages) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                ratio = torch.exp(log_prob - rollout_data.old_log_prob)
                policy_loss_1 = advantages * ratio
                policy_loss_2 = advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)
                policy_loss = -torch.min(policy_loss_1, policy_loss_2).mean()
                pg_losses.append(policy_loss.detach())
                clip_fractions.append(torch.mean((torch.abs(ratio - 1) > clip_range).float()))
                if clip_range_vf is None:
                    values_pred = values
                else:
                    values_pred = rollout_data.old_values + torch.clamp(values - rollout_data.old_values,
                                                                        -clip_range_vf, clip_range_vf)
                value_loss = F.mse_loss(rollout_data.returns, values_pred)
                value_losses.append(value_loss.detach())
                entropy_loss = -torch.mean(-log_prob) if entropy is None else -torch.mean(entropy)
                entropy_losses.append(entropy_loss.detach())
                loss = policy_loss + model.ent_coef * entropy_loss + model.vf_coef * value_loss
                with torch.no_grad():
                    log_ratio = log_prob - rollout_data.old_log_prob
                    approx_kl_divs.append(torch.mean((torch.exp(log_ratio) - 1) - log_ratio))
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


def ppo_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[[], None]:
    def train() -> None:
        _ppo_train(model, fused_optimizer)
    return train


def a2c_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[[], None]:
    def train() -> None:
        _a2c_train(model, fused_optimizer)
    return train
