"""Fused updates of the actor-critic algorithms: DDPG, TD3 and SAC (fixed or auto-tuned alpha) with
Tianshou's continuous actors and ``ContinuousCritic`` critics (twin critics' losses in one backward); SAC's
step also compiled whole (``training.compiled_updates``: :mod:`.compiled_sac`)."""

from __future__ import annotations

import numpy as np
import torch

from rlaccel_plugins.fused import zero_grad
from rlaccel_plugins.fused.distributions import normal_log_prob, normal_rsample
from rlaccel_tianshou.flat_networks import forward_of, is_mode_free, lagged, parameters_of
from rlaccel_tianshou.fused.common import (
    algorithm_step,
    as_input,
    clip_and_step,
    nstep_returns,
    on_nets,
    plain_step,
    polyak,
    training,
    weights_of,
)


def _critic_step(critic, optimizer, obs: torch.Tensor, act: torch.Tensor, returns: torch.Tensor, weight):
    """``_minimize_critic_squared_loss``: one critic's squared TD loss and optimizer step."""
    loss = _critic_loss(critic, obs, act, returns, weight)
    algorithm_step(optimizer, loss)
    return loss


def _critic_loss(critic, obs: torch.Tensor, act: torch.Tensor, returns: torch.Tensor, weight) -> torch.Tensor:
    td = forward_of(critic)(obs, act).flatten() - returns.flatten()
    return (td.pow(2) * weight).mean()


def _twin_critic_steps(critics: tuple, optimizers: tuple, obs: torch.Tensor, act: torch.Tensor,
                       returns: torch.Tensor, weight) -> list[torch.Tensor]:
    """:func:`_critic_step` for both critics of TD3 / SAC, in order, with one backward for the two losses
    where the critics are separate networks, each stepped by Tianshou's own ``Optimizer.step`` over its own
    parameters: a loss then reaches only its own critic's parameters, so each gradient is the one its own
    backward writes, and the second loss never reads the first critic's weights, which its step changes
    first in Tianshou's order. The two clips and steps follow in Tianshou's order."""
    if not _disjoint(critics, optimizers):
        return [_critic_step(c, o, obs, act, returns, weight) for c, o in zip(critics, optimizers)]
    losses = [_critic_loss(critic, obs, act, returns, weight) for critic in critics]
    for optimizer in optimizers:
        zero_grad(optimizer._optim)
    torch.autograd.backward(losses)
    for optimizer in optimizers:
        clip_and_step(optimizer)
    return losses


_TENSOR_BACKWARD = torch.Tensor.backward  # torch's own, to tell it from a patch


def _disjoint(critics: tuple, optimizers: tuple) -> bool:
    """Whether each optimizer is Tianshou's own step of its critic alone, no parameter is shared, and
    ``Tensor.backward`` is torch's own: one ``torch.autograd.backward`` call would go around a patch of it,
    which a loss scaler makes (fp16's, whose scale may change between the two steps; the fused updates run
    in fp32, so it is a user's patch that this keeps)."""
    if torch.Tensor.backward is not _TENSOR_BACKWARD or critics[0] is critics[1]:
        return False
    if not all(plain_step(optimizer) and optimizer._module is critic for critic, optimizer in zip(critics, optimizers)):
        return False
    owned = [{id(p) for p in parameters_of(critic)} for critic in critics]
    if owned[0] & owned[1]:
        return False
    return all(id(p) in own for own, o in zip(owned, optimizers) for group in o._optim.param_groups
               for p in group["params"])


def _actor_critic_inputs(algorithm, buffer, indices: np.ndarray, weight, returns: torch.Tensor):
    """The sampled observations and actions (arrays for the layer trace, tensors for the networks) and
    the importance weights."""
    obs_np, act_np = buffer.obs[indices], buffer.act[indices]
    return obs_np, act_np, as_input(algorithm, obs_np), as_input(algorithm, act_np), weights_of(weight, returns)


def ddpg_learn(wrapper, ddpg, buffer, indices: np.ndarray, weight):
    """DDPG's ``_preprocess_batch`` + ``_update_with_batch``."""
    from tianshou.algorithm.modelfree.ddpg import DDPGTrainingStats

    actor, critic = ddpg.policy.actor, ddpg.critic
    mode_free = is_mode_free(actor, critic)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        act_next = forward_of(lagged(ddpg.actor_old, mode_free))(obs_next)[0]
        return forward_of(lagged(ddpg.critic_old, mode_free))(obs_next, act_next)

    returns = nstep_returns(ddpg, buffer, indices, ddpg.n_step_return_horizon, target_q_of)
    obs_np, act_np, obs, act, weights = _actor_critic_inputs(ddpg, buffer, indices, weight, returns)
    with training(wrapper, ddpg, [actor, critic], obs_np, act_np):
        critic_loss = _critic_step(critic, ddpg.critic_optim, obs, act, returns, weights)
        actor_loss = -forward_of(critic)(obs, forward_of(actor)(obs)[0]).mean()
        algorithm_step(ddpg.policy_optim, actor_loss, own_gradients_only=True)
        polyak(ddpg)
    return wrapper._stats(DDPGTrainingStats(actor_loss=actor_loss.item(), critic_loss=critic_loss.item()))


def td3_learn(wrapper, td3, buffer, indices: np.ndarray, weight):
    """TD3's ``_preprocess_batch`` (target policy smoothing: the same ``randn`` draw) + ``_update_with_batch``
    (delayed actor updates)."""
    from tianshou.algorithm.modelfree.td3 import TD3TrainingStats

    actor, critic, critic2 = td3.policy.actor, td3.critic, td3.critic2
    mode_free = is_mode_free(actor, critic, critic2)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        act_next = forward_of(lagged(td3.actor_old, mode_free))(obs_next)[0]
        noise = torch.randn(size=act_next.shape, device=act_next.device) * td3.policy_noise
        if td3.noise_clip > 0.0:
            noise = noise.clamp(-td3.noise_clip, td3.noise_clip)
        act_next += noise
        return torch.min(forward_of(lagged(td3.critic_old, mode_free))(obs_next, act_next),
                         forward_of(lagged(td3.critic2_old, mode_free))(obs_next, act_next))

    returns = nstep_returns(td3, buffer, indices, td3.n_step_return_horizon, target_q_of)
    obs_np, act_np, obs, act, weights = _actor_critic_inputs(td3, buffer, indices, weight, returns)
    with training(wrapper, td3, [actor, critic, critic2], obs_np, act_np):
        critic1_loss, critic2_loss = _twin_critic_steps((critic, critic2), (td3.critic_optim, td3.critic2_optim),
                                                        obs, act, returns, weights)
        if td3._cnt % td3.update_actor_freq == 0:
            actor_loss = -forward_of(critic)(obs, forward_of(actor)(obs)[0]).mean()
            td3._last = actor_loss.item()
            algorithm_step(td3.policy_optim, actor_loss, own_gradients_only=True)
            polyak(td3)
        td3._cnt += 1
    return wrapper._stats(TD3TrainingStats(actor_loss=td3._last, critic1_loss=critic1_loss.item(),
                                           critic2_loss=critic2_loss.item()))


def sac_learn(wrapper, sac, buffer, indices: np.ndarray, weight):
    """SAC's ``_preprocess_batch`` + ``_update_with_batch`` (entropy tuning included)."""
    from tianshou.algorithm.modelfree.sac import SACTrainingStats
    from tianshou.utils.conversion import to_optional_float

    actor, critic, critic2 = sac.policy.actor, sac.critic, sac.critic2
    mode_free = is_mode_free(actor, critic, critic2)
    alpha = sac.alpha.value  # unchanged until alpha.update below

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        act_next, log_prob = _squashed_gaussian(actor, obs_next)
        return torch.min(forward_of(lagged(sac.critic_old, mode_free))(obs_next, act_next),
                         forward_of(lagged(sac.critic2_old, mode_free))(obs_next, act_next)) - alpha * log_prob

    returns = nstep_returns(sac, buffer, indices, sac.n_step_return_horizon, target_q_of)
    obs_np, act_np, obs, act, weights = _actor_critic_inputs(sac, buffer, indices, weight, returns)
    with training(wrapper, sac, [actor, critic, critic2], obs_np, act_np):
        compiled = wrapper.compiled_step()
        if compiled is not None:
            critic1_loss, critic2_loss, actor_loss, *tuned = compiled(obs, act, returns, weights)
            alpha_loss = tuned[0].item() if tuned else None
        else:
            critic1_loss, critic2_loss = _twin_critic_steps((critic, critic2), (sac.critic_optim, sac.critic2_optim),
                                                            obs, act, returns, weights)
            act_pi, log_prob = _squashed_gaussian(actor, obs)
            actor_loss = (alpha * log_prob.flatten() - torch.min(forward_of(critic)(obs, act_pi).flatten(),
                                                                 forward_of(critic2)(obs, act_pi).flatten())).mean()
            algorithm_step(sac.policy_optim, actor_loss, own_gradients_only=True)
            alpha_loss = sac.alpha.update(-log_prob.detach())
            polyak(sac)
    return wrapper._stats(SACTrainingStats(actor_loss=actor_loss.item(), critic1_loss=critic1_loss.item(),
                                           critic2_loss=critic2_loss.item(), alpha=to_optional_float(sac.alpha.value),
                                           alpha_loss=to_optional_float(alpha_loss)))


def _squashed_gaussian(actor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``SACPolicy.forward`` within a training step: a reparameterized sample, tanh-squashed, and its
    corrected log-probability — ``Independent(Normal(loc, scale), 1)``'s draw and log-density as their
    own ops (:mod:`rlaccel_plugins.fused.distributions`: the same draws and arithmetic, without the
    objects' argument checks), summed over the last dim as ``Independent`` sums."""
    from tianshou.algorithm.modelfree.sac import correct_log_prob_gaussian_tanh

    (loc, scale), _ = forward_of(actor)(obs)
    act = normal_rsample(loc, scale)
    squashed = torch.tanh(act)
    log_prob = normal_log_prob(act, loc, scale)
    log_prob = log_prob.reshape(*log_prob.shape[:-1], -1).sum(-1)  # Independent's _sum_rightmost
    return squashed, correct_log_prob_gaussian_tanh(log_prob.unsqueeze(-1), squashed)


def _critics_covered(algorithm, twin: bool) -> bool:
    from tianshou.utils.net.continuous import ContinuousCritic

    critics = [algorithm.critic, *([algorithm.critic2] if twin else [])]
    return all(on_nets(c, (ContinuousCritic,)) for c in critics)


def _deterministic_actor_covered(algorithm) -> bool:
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.utils.net.continuous import ContinuousActorDeterministic

    policy = algorithm.policy
    return type(policy) is ContinuousDeterministicPolicy and on_nets(policy.actor, (ContinuousActorDeterministic,))


def ddpg_eligible(algorithm) -> bool:
    """Whether ``algorithm`` (DDPG) is covered: Tianshou's deterministic actor and critic on ``Net``s."""
    return _critics_covered(algorithm, twin=False) and _deterministic_actor_covered(algorithm)


def td3_eligible(algorithm) -> bool:
    """Whether ``algorithm`` (TD3) is covered: Tianshou's deterministic actor and twin critics on ``Net``s."""
    return _critics_covered(algorithm, twin=True) and _deterministic_actor_covered(algorithm)


def sac_eligible(algorithm) -> bool:
    """Whether ``algorithm`` (SAC) is covered: Tianshou's probabilistic actor and twin critics on ``Net``s,
    a fixed or auto-tuned alpha."""
    from tianshou.algorithm.modelfree.sac import AutoAlpha, FixedAlpha, SACPolicy
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic

    policy = algorithm.policy
    return (_critics_covered(algorithm, twin=True) and type(policy) is SACPolicy
            and on_nets(policy.actor, (ContinuousActorProbabilistic,))
            and type(algorithm.alpha) in (FixedAlpha, AutoAlpha))
