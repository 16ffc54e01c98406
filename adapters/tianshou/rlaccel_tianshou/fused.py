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
Polyak target update in three multi-tensor ops with Tianshou's rounding. Tianshou's ``Net``,
``MLP``, ``ContinuousCritic``, the continuous actors and ``DiscreteActor`` / ``DiscreteCritic`` of
Linear/ReLU/Tanh layers are called as the same tensor ops without their module calls (each ``Net`` call
is four modules deep and lists the network's parameters to find its device), where no forward hook is
registered. Equal to Tianshou's update,
tested step by step (``tests/equivalence/test_tianshou_fused.py``).

Fused: ``DQN`` (plain and double, Huber or MSE, any n-step, with or without a target network) and
``QRDQN`` on a Tianshou ``Net``; ``DDPG``, ``TD3`` and ``SAC`` (fixed or auto-tuned alpha) with
Tianshou's ``ContinuousActorDeterministic`` / ``ContinuousActorProbabilistic`` actor and
``ContinuousCritic`` critics; with buffers of array observations, ``stack_num=1`` and without
prioritized replay. Anything else runs Tianshou's own update.
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlaccel_plugins.fused import OptimizerKernels, optimizer_step, polyak_update_, zero_grad
from rlaccel_plugins.fused.distributions import FlatCategorical, normal_log_prob, normal_rsample
from rlaccel_plugins.fused.flat import flat_layers
from rlaccel_plugins.fused.kernels import backward_to, clip_grad_norm
from rlaccel_plugins.fused.module_cache import cached, new_epoch
from rlaccel_plugins.fused.module_cache import parameters as module_parameters
from rlaccel_tianshou.buffer_reads import sample_indices, unfinished_index

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
            return _update(_dqn_learn if kind is DQN else _qrdqn_learn)
        return None
    if kind is PPO:
        actors, critics = (DiscreteActor, ContinuousActorProbabilistic), (DiscreteCritic, ContinuousCritic)
        if type(policy) in (ProbabilisticActorPolicy, DiscreteActorPolicy) and _on_nets(policy.actor, actors) \
                and _on_nets(algorithm.critic, critics):
            return _on_policy_update(_ppo_learn)
        return None
    if kind not in (DDPG, TD3, SAC):
        return None
    critics = [algorithm.critic] + ([algorithm.critic2] if kind in (TD3, SAC) else [])
    if not all(_on_nets(c, (ContinuousCritic,)) for c in critics):
        return None
    if kind is SAC:
        if type(policy) is SACPolicy and _on_nets(policy.actor, (ContinuousActorProbabilistic,)) \
                and type(algorithm.alpha) in (FixedAlpha, AutoAlpha):
            return _update(_sac_learn)
        return None
    if type(policy) is ContinuousDeterministicPolicy and _on_nets(policy.actor, (ContinuousActorDeterministic,)):
        return _update(_td3_learn if kind is TD3 else _ddpg_learn)
    return None


def _on_nets(module: torch.nn.Module, classes: tuple[type, ...]) -> bool:
    """Whether ``module`` is one of Tianshou's ``classes`` on a Tianshou ``Net``: modules that turn their
    input into a float32 tensor first, so the fused update may hand them that tensor."""
    from tianshou.utils.net.common import Net

    return type(module) in classes and type(getattr(module, "preprocess", None)) is Net


def fusable_buffer(buffer) -> bool:
    """Whether the fused update reads ``buffer`` as Tianshou would (else the update runs Tianshou's own)."""
    if buffer is None or hasattr(buffer, "update_weight") or getattr(buffer, "stack_num", 1) != 1:
        return False
    obs = buffer._meta.get("obs", None) if len(buffer) else None
    return isinstance(obs, np.ndarray)


def _update(learn: Callable) -> Callable[[Any, Any, int | None], Any]:
    """``Algorithm._update`` of the wrapper, with ``learn(wrapper, algorithm, buffer, indices, weight)``
    in place of ``buffer.sample`` + ``_preprocess_batch`` + ``_update_with_batch`` (a ``partial`` of
    module-level functions, so a wrapper holding it pickles)."""
    return functools.partial(_run_update, learn)


def _on_policy_update(learn: Callable) -> Callable[[Any, Any, int | None, int], Any]:
    """``OnPolicyAlgorithm.update(buffer, batch_size, repeat)`` of the wrapper: the whole buffer, in
    ``learn(wrapper, algorithm, buffer, indices, weight, batch_size, repeat)``."""
    return functools.partial(_run_on_policy_update, learn)


# the phase of the update in progress (its target side, then its training step under the wrapper's
# autocast): within one, what is built from a network is checked against the network once
_epoch: int | None = None


def _next_epoch() -> None:
    global _epoch
    _epoch = new_epoch()


def _run_update(learn: Callable, wrapper, buffer, sample_size: int | None, *args):
    global _epoch
    algorithm = wrapper.wrapped_algorithm
    if not algorithm.policy.is_within_training_step:
        raise RuntimeError("update() must be called within policy_within_training_step (as Tianshou's own)")
    start_time = time.time()
    wrapper._last_buffer = buffer
    if hasattr(buffer, "_last_weights"):
        buffer._last_weights = None
    indices = sample_indices(buffer, sample_size)  # the draws buffer.sample() makes
    _next_epoch()
    try:
        stats = learn(wrapper, algorithm, buffer, indices, getattr(buffer, "_last_weights", None), *args)
    finally:
        _epoch = None
    for lr_scheduler in wrapper.lr_schedulers:
        lr_scheduler.step()
    stats.train_time = time.time() - start_time
    return stats


def _run_on_policy_update(learn: Callable, wrapper, buffer, batch_size: int | None, repeat: int):
    return _run_update(learn, wrapper, buffer, 0, batch_size, repeat)


def _nstep_returns(algorithm, buffer, indices: np.ndarray, n_step: int,
                   target_q_of: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``Algorithm.compute_nstep_return``'s ``batch.returns``, reading only what it reads;
    ``target_q_of(obs_next)`` is the algorithm's ``_target_q`` on the observations ``n_step`` ahead."""
    from tianshou.algorithm.algorithm_base import Algorithm, _nstep_return

    stacked = [indices]
    for _ in range(n_step - 1):
        stacked.append(buffer.next(stacked[-1]))
    stacked = np.stack(stacked)
    after_n = stacked[-1]
    with torch.no_grad():
        target_q = target_q_of(_as_input(algorithm, _obs_next(buffer, after_n)))
    target_q_np = target_q.reshape(len(indices), -1).cpu().numpy()
    target_q_np *= Algorithm.value_mask(buffer, after_n).reshape(-1, 1)
    unfinished = np.zeros(len(buffer.done), dtype=bool)  # np.isin(stacked, unfinished_index()), as a lookup
    unfinished[unfinished_index(buffer)] = True
    end_flags = buffer.done[stacked] | unfinished[stacked]  # buffer.done.copy(), only here
    positions = np.arange(stacked.size).reshape(stacked.shape)
    returns = _nstep_return(buffer.rew[stacked].reshape(-1), end_flags.reshape(-1), target_q_np, positions,
                            algorithm.gamma, n_step)
    return torch.as_tensor(returns, device=target_q.device).to(target_q.dtype)


def _as_input(algorithm, array: np.ndarray) -> torch.Tensor:
    """What Tianshou's networks turn an observation or action array into (``torch.as_tensor(x, device,
    float32)``), done once instead of once per network call."""
    return torch.as_tensor(array, device=first_parameter(algorithm).device, dtype=torch.float32)


_FIRST_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def first_parameter(module: torch.nn.Module) -> torch.Tensor:
    """``next(module.parameters())``, found once (listing the parameters walks every submodule, ~30 µs
    for an algorithm); the parameter follows the module to any device (``Module.to`` moves its data)."""
    parameter = _FIRST_PARAMETERS.get(module)
    if parameter is None:
        parameter = _FIRST_PARAMETERS[module] = next(module.parameters())
    return parameter


def _weights(weight: np.ndarray | None, like: torch.Tensor) -> torch.Tensor | float:
    """``batch.weight`` as ``compute_nstep_return`` converts it (1.0 where the buffer gives none)."""
    return 1.0 if weight is None else torch.as_tensor(weight, device=like.device).to(like.dtype)


@contextlib.contextmanager
def _training(wrapper, algorithm, modules: list[torch.nn.Module], obs: np.ndarray, act: np.ndarray):
    """The context ``_update_with_batch`` runs in: train mode, the wrapper's layer trace, guard and
    autocast, and multi-tensor optimizer kernels (single-kernel ones with ``training.fused_optimizer``)."""
    from tianshou.utils.torch_utils import torch_train_mode

    # the train/eval switch walks every module twice per update (~15% of a small one); it changes
    # nothing for networks whose layers compute the same in both modes, so such networks skip it
    with contextlib.nullcontext() if _mode_free(*modules) else torch_train_mode(wrapper):
        attaching = wrapper.updater is not None and not wrapper.updater.attachments
        wrapper._ensure_attached(_FirstBatch(obs, act))
        kernels = OptimizerKernels([optimizer._optim for optimizer in algorithm._optimizers],
                                   fused=wrapper.rlaccel_config.training.fused_optimizer)
        autocast = wrapper._autocast()
        with autocast, kernels:
            if attaching or type(autocast) is not contextlib.nullcontext:
                _next_epoch()  # the layer trace's or autocast's hooks: the networks are checked again
            yield


def _step(optimizer, loss: torch.Tensor, own_gradients_only: bool = False) -> None:
    """Tianshou's ``Algorithm.Optimizer.step(loss)``: zero the gradients, backward, clip to its
    ``max_grad_norm``, step — the step as flat ops where :mod:`rlaccel_plugins.fused.flat_optim` covers it.
    ``own_gradients_only``: the backward computes only the optimizer's parameters' gradients (an actor's
    loss: not into the critics' weights, whose gradients Tianshou computes and never applies)."""
    if not _plain_step(optimizer):  # a subclass's own step
        optimizer.step(loss)
        return
    zero_grad(optimizer._optim)
    if own_gradients_only:
        backward_to(loss, optimizer._optim)
    else:
        loss.backward()
    _clip_and_step(optimizer)


def _plain_step(optimizer) -> bool:
    from tianshou.algorithm.algorithm_base import Algorithm

    return type(optimizer).step is Algorithm.Optimizer.step


def _clip_and_step(optimizer) -> None:
    """The rest of ``Algorithm.Optimizer.step`` once the gradients are there."""
    if optimizer._max_grad_norm is not None:
        clip_grad_norm(_parameters(optimizer._module), optimizer._max_grad_norm)
    optimizer_step(optimizer._optim)


def _polyak(algorithm) -> None:
    """``_update_lagged_network_weights`` of the Polyak mixin, as three multi-tensor ops."""
    pairs = algorithm._lagged_networks._lagged_network_pairs
    sources = [p for pair in pairs for p in _parameters(pair.source)]
    targets = [p for pair in pairs for p in _parameters(pair.target)]
    polyak_update_([p.data for p in sources], [p.data for p in targets], algorithm.tau, weighted_sum=True)


def _parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return module_parameters(module, _epoch)


def _lagged(network: torch.nn.Module, mode_free: bool) -> torch.nn.Module:
    """A lagged network's module: its wrapper switches it to eval mode first, unless that changes nothing."""
    return network.module if mode_free else network


# ------------------------------------------------------------------------------------------ DQN family
def _dqn_learn(wrapper, dqn, buffer, indices: np.ndarray, weight):
    """DQN's ``_preprocess_batch`` + ``_update_with_batch``."""
    from tianshou.algorithm.modelfree.dqn import SimpleLossTrainingStats

    model = dqn.policy.model
    mode_free = _mode_free(model)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        online, _ = _forward(model)(obs_next)
        target_q = _forward(_lagged(dqn.model_old, mode_free))(obs_next)[0] if dqn.use_target_network else online
        if dqn.is_double:  # Tianshou indexes with the argmax as numpy arrays: the same values
            return target_q.gather(1, online.argmax(dim=1, keepdim=True)).squeeze(1)
        return target_q.max(dim=1)[0]

    returns = _nstep_returns(dqn, buffer, indices, dqn.n_step, target_q_of)
    obs, act = buffer.obs[indices], buffer.act[indices]
    with _training(wrapper, dqn, [model], obs, act):
        dqn._periodically_update_lagged_network_weights()
        q = _forward(model)(_as_input(dqn, obs))[0]
        q = q.gather(1, torch.as_tensor(act, dtype=torch.long, device=q.device).reshape(-1, 1)).squeeze(1)
        returns = returns.flatten().to(q.dtype)
        if dqn.huber_loss_delta is not None:
            loss = torch.nn.functional.huber_loss(q.reshape(-1, 1), returns.reshape(-1, 1),
                                                  delta=dqn.huber_loss_delta, reduction="mean")
        else:
            loss = ((returns - q).pow(2) * _weights(weight, returns)).mean()
        _step(dqn.optim, loss)
    return wrapper._stats(SimpleLossTrainingStats(loss=loss.item()))


def _qrdqn_learn(wrapper, qrdqn, buffer, indices: np.ndarray, weight):
    """QRDQN's ``_preprocess_batch`` + ``_update_with_batch`` (the quantile Huber loss)."""
    from tianshou.algorithm.modelfree.dqn import SimpleLossTrainingStats

    model = qrdqn.policy.model
    mode_free = _mode_free(model)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        online, _ = _forward(model)(obs_next)
        act = online.mean(2).argmax(dim=1).cpu().numpy()
        next_dist = _forward(_lagged(qrdqn.model_old, mode_free))(obs_next)[0] if qrdqn.use_target_network else online
        return next_dist[np.arange(len(act)), act, :]

    returns = _nstep_returns(qrdqn, buffer, indices, qrdqn.n_step, target_q_of)
    obs, act = buffer.obs[indices], buffer.act[indices]
    with _training(wrapper, qrdqn, [model], obs, act):
        qrdqn._periodically_update_lagged_network_weights()
        curr_dist = _forward(model)(_as_input(qrdqn, obs))[0]
        curr_dist = curr_dist[np.arange(len(act)), act, :].unsqueeze(2)
        target_dist = returns.unsqueeze(1)
        dist_diff = torch.nn.functional.smooth_l1_loss(target_dist, curr_dist, reduction="none")
        huber_loss = (dist_diff * (qrdqn.tau_hat - (target_dist - curr_dist).detach().le(0.0).float()).abs()) \
            .sum(-1).mean(1)
        loss = (huber_loss * _weights(weight, returns)).mean()
        _step(qrdqn.optim, loss)
    return wrapper._stats(SimpleLossTrainingStats(loss=loss.item()))


# ------------------------------------------------------------------------------ actor-critic family
def _critic_step(critic, optimizer, obs: torch.Tensor, act: torch.Tensor, returns: torch.Tensor, weight):
    """``_minimize_critic_squared_loss``: one critic's squared TD loss and optimizer step."""
    loss = _critic_loss(critic, obs, act, returns, weight)
    _step(optimizer, loss)
    return loss


def _critic_loss(critic, obs: torch.Tensor, act: torch.Tensor, returns: torch.Tensor, weight) -> torch.Tensor:
    td = _forward(critic)(obs, act).flatten() - returns.flatten()
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
        _clip_and_step(optimizer)
    return losses


_TENSOR_BACKWARD = torch.Tensor.backward  # torch's own, to tell it from a patch


def _disjoint(critics: tuple, optimizers: tuple) -> bool:
    """Whether each optimizer is Tianshou's own step of its critic alone, no parameter is shared, and
    ``Tensor.backward`` is torch's own: one ``torch.autograd.backward`` call would go around a patch of it,
    which a loss scaler makes (fp16's, whose scale may change between the two steps; the fused updates run
    in fp32, so it is a user's patch that this keeps)."""
    if torch.Tensor.backward is not _TENSOR_BACKWARD or critics[0] is critics[1]:
        return False
    if not all(_plain_step(optimizer) and optimizer._module is critic for critic, optimizer in zip(critics, optimizers)):
        return False
    owned = [{id(p) for p in _parameters(critic)} for critic in critics]
    if owned[0] & owned[1]:
        return False
    return all(id(p) in own for own, o in zip(owned, optimizers) for group in o._optim.param_groups
               for p in group["params"])


def _actor_critic_inputs(algorithm, buffer, indices: np.ndarray, weight, returns: torch.Tensor):
    """The sampled observations and actions (arrays for the layer trace, tensors for the networks) and
    the importance weights."""
    obs_np, act_np = buffer.obs[indices], buffer.act[indices]
    return obs_np, act_np, _as_input(algorithm, obs_np), _as_input(algorithm, act_np), _weights(weight, returns)


def _ddpg_learn(wrapper, ddpg, buffer, indices: np.ndarray, weight):
    """DDPG's ``_preprocess_batch`` + ``_update_with_batch``."""
    from tianshou.algorithm.modelfree.ddpg import DDPGTrainingStats

    actor, critic = ddpg.policy.actor, ddpg.critic
    mode_free = _mode_free(actor, critic)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        act_next = _forward(_lagged(ddpg.actor_old, mode_free))(obs_next)[0]
        return _forward(_lagged(ddpg.critic_old, mode_free))(obs_next, act_next)

    returns = _nstep_returns(ddpg, buffer, indices, ddpg.n_step_return_horizon, target_q_of)
    obs_np, act_np, obs, act, weights = _actor_critic_inputs(ddpg, buffer, indices, weight, returns)
    with _training(wrapper, ddpg, [actor, critic], obs_np, act_np):
        critic_loss = _critic_step(critic, ddpg.critic_optim, obs, act, returns, weights)
        actor_loss = -_forward(critic)(obs, _forward(actor)(obs)[0]).mean()
        _step(ddpg.policy_optim, actor_loss, own_gradients_only=True)
        _polyak(ddpg)
    return wrapper._stats(DDPGTrainingStats(actor_loss=actor_loss.item(), critic_loss=critic_loss.item()))


def _td3_learn(wrapper, td3, buffer, indices: np.ndarray, weight):
    """TD3's ``_preprocess_batch`` (target policy smoothing: the same ``randn`` draw) + ``_update_with_batch``
    (delayed actor updates)."""
    from tianshou.algorithm.modelfree.td3 import TD3TrainingStats

    actor, critic, critic2 = td3.policy.actor, td3.critic, td3.critic2
    mode_free = _mode_free(actor, critic, critic2)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        act_next = _forward(_lagged(td3.actor_old, mode_free))(obs_next)[0]
        noise = torch.randn(size=act_next.shape, device=act_next.device) * td3.policy_noise
        if td3.noise_clip > 0.0:
            noise = noise.clamp(-td3.noise_clip, td3.noise_clip)
        act_next += noise
        return torch.min(_forward(_lagged(td3.critic_old, mode_free))(obs_next, act_next),
                         _forward(_lagged(td3.critic2_old, mode_free))(obs_next, act_next))

    returns = _nstep_returns(td3, buffer, indices, td3.n_step_return_horizon, target_q_of)
    obs_np, act_np, obs, act, weights = _actor_critic_inputs(td3, buffer, indices, weight, returns)
    with _training(wrapper, td3, [actor, critic, critic2], obs_np, act_np):
        critic1_loss, critic2_loss = _twin_critic_steps((critic, critic2), (td3.critic_optim, td3.critic2_optim),
                                                        obs, act, returns, weights)
        if td3._cnt % td3.update_actor_freq == 0:
            actor_loss = -_forward(critic)(obs, _forward(actor)(obs)[0]).mean()
            td3._last = actor_loss.item()
            _step(td3.policy_optim, actor_loss, own_gradients_only=True)
            _polyak(td3)
        td3._cnt += 1
    return wrapper._stats(TD3TrainingStats(actor_loss=td3._last, critic1_loss=critic1_loss.item(),
                                           critic2_loss=critic2_loss.item()))


def _sac_learn(wrapper, sac, buffer, indices: np.ndarray, weight):
    """SAC's ``_preprocess_batch`` + ``_update_with_batch`` (entropy tuning included)."""
    from tianshou.algorithm.modelfree.sac import SACTrainingStats
    from tianshou.utils.conversion import to_optional_float

    actor, critic, critic2 = sac.policy.actor, sac.critic, sac.critic2
    mode_free = _mode_free(actor, critic, critic2)
    alpha = sac.alpha.value  # unchanged until alpha.update below

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        act_next, log_prob = _squashed_gaussian(actor, obs_next)
        return torch.min(_forward(_lagged(sac.critic_old, mode_free))(obs_next, act_next),
                         _forward(_lagged(sac.critic2_old, mode_free))(obs_next, act_next)) - alpha * log_prob

    returns = _nstep_returns(sac, buffer, indices, sac.n_step_return_horizon, target_q_of)
    obs_np, act_np, obs, act, weights = _actor_critic_inputs(sac, buffer, indices, weight, returns)
    with _training(wrapper, sac, [actor, critic, critic2], obs_np, act_np):
        critic1_loss, critic2_loss = _twin_critic_steps((critic, critic2), (sac.critic_optim, sac.critic2_optim),
                                                        obs, act, returns, weights)
        act_pi, log_prob = _squashed_gaussian(actor, obs)
        actor_loss = (alpha * log_prob.flatten() - torch.min(_forward(critic)(obs, act_pi).flatten(),
                                                             _forward(critic2)(obs, act_pi).flatten())).mean()
        _step(sac.policy_optim, actor_loss, own_gradients_only=True)
        alpha_loss = sac.alpha.update(-log_prob.detach())
        _polyak(sac)
    return wrapper._stats(SACTrainingStats(actor_loss=actor_loss.item(), critic1_loss=critic1_loss.item(),
                                           critic2_loss=critic2_loss.item(), alpha=to_optional_float(sac.alpha.value),
                                           alpha_loss=to_optional_float(alpha_loss)))


def _squashed_gaussian(actor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``SACPolicy.forward`` within a training step: a reparameterized sample, tanh-squashed, and its
    corrected log-probability — ``Independent(Normal(loc, scale), 1)``'s draw and log-density as their
    own ops (:mod:`rlaccel_plugins.fused.distributions`: the same draws and arithmetic, without the
    objects' argument checks), summed over the last dim as ``Independent`` sums."""
    from tianshou.algorithm.modelfree.sac import correct_log_prob_gaussian_tanh

    (loc, scale), _ = _forward(actor)(obs)
    act = normal_rsample(loc, scale)
    squashed = torch.tanh(act)
    log_prob = normal_log_prob(act, loc, scale)
    log_prob = log_prob.reshape(*log_prob.shape[:-1], -1).sum(-1)  # Independent's _sum_rightmost
    return squashed, correct_log_prob_gaussian_tanh(log_prob.unsqueeze(-1), squashed)


# ------------------------------------------------------------------------------------------- PPO
def _ppo_learn(wrapper, ppo, buffer, indices: np.ndarray, _weight, batch_size: int | None, repeat: int):
    """PPO's ``_preprocess_batch`` (GAE, old log-probabilities) + ``_update_with_batch``: each field
    converted to a tensor once, minibatches as index gathers of those tensors (Tianshou's ``Batch.split``
    indexes every field of the batch), the same shuffles and the same ``dist.sample()`` draws."""
    from tianshou.algorithm.modelfree.a2c import A2CTrainingStats
    from tianshou.data import SequenceSummaryStats

    if ppo.recompute_adv:
        ppo._buffer, ppo._indices = buffer, indices
    obs = _as_input(ppo, buffer.obs[indices])
    obs_next = _as_input(ppo, _obs_next(buffer, indices))
    rollout = _Rollout(buffer, indices)
    v_s, returns, adv = _returns_and_advantages(ppo, buffer, indices, obs, obs_next, rollout)
    act = torch.as_tensor(buffer.act[indices]).to(v_s)
    with torch.no_grad():
        logp_old = torch.cat([_policy_dist(ppo.policy, obs[chunk]).log_prob(act[chunk])
                              for chunk in _split(len(indices), ppo.max_batchsize, shuffle=False)]).flatten()
    losses, clip_losses, vf_losses, ent_losses = [], [], [], []
    head = indices[:8]  # what the layer trace reads
    with _training(wrapper, ppo, [ppo.policy.actor, ppo.critic], buffer.obs[head], buffer.act[head]):
        for step in range(repeat):
            if ppo.recompute_adv and step > 0:
                v_s, returns, adv = _returns_and_advantages(ppo, buffer, indices, obs, obs_next, rollout)
            for chunk in _split(len(indices), batch_size or -1, shuffle=True):
                chunk = torch.as_tensor(chunk)
                advantages = adv[chunk]
                dist = _policy_dist(ppo.policy, obs[chunk])
                if ppo.advantage_normalization:
                    mean, std = advantages.mean(), advantages.std()
                    advantages = (advantages - mean) / (std + ppo._eps)
                ratios = (dist.log_prob(act[chunk]) - logp_old[chunk]).exp().float()
                ratios = ratios.reshape(ratios.size(0), -1).transpose(0, 1)
                surr1 = ratios * advantages
                surr2 = ratios.clamp(1.0 - ppo.eps_clip, 1.0 + ppo.eps_clip) * advantages
                if ppo.dual_clip:
                    clip1 = torch.min(surr1, surr2)
                    clip2 = torch.max(clip1, ppo.dual_clip * advantages)
                    clip_loss = -torch.where(advantages < 0, clip2, clip1).mean()
                else:
                    clip_loss = -torch.min(surr1, surr2).mean()
                value = _forward(ppo.critic)(obs[chunk]).flatten()
                if ppo.value_clip:
                    v_clip = v_s[chunk] + (value - v_s[chunk]).clamp(-ppo.eps_clip, ppo.eps_clip)
                    vf_loss = torch.max((returns[chunk] - value).pow(2), (returns[chunk] - v_clip).pow(2)).mean()
                else:
                    vf_loss = (returns[chunk] - value).pow(2).mean()
                ent_loss = dist.entropy().mean()
                loss = clip_loss + ppo.vf_coef * vf_loss - ppo.ent_coef * ent_loss
                _step(ppo.optim, loss)
                clip_losses.append(clip_loss.item())
                vf_losses.append(vf_loss.item())
                ent_losses.append(ent_loss.item())
                losses.append(loss.item())
    return wrapper._stats(A2CTrainingStats(
        loss=SequenceSummaryStats.from_sequence(losses), actor_loss=SequenceSummaryStats.from_sequence(clip_losses),
        vf_loss=SequenceSummaryStats.from_sequence(vf_losses), ent_loss=SequenceSummaryStats.from_sequence(ent_losses),
        gradient_steps=len(losses)))


class _Rollout:
    """The fields of the sampled batch ``compute_episodic_return`` reads."""

    def __init__(self, buffer, indices: np.ndarray) -> None:
        self.rew, self.terminated, self.truncated = (buffer.rew[indices], buffer.terminated[indices],
                                                     buffer.truncated[indices])


def _returns_and_advantages(algorithm, buffer, indices: np.ndarray, obs: torch.Tensor, obs_next: torch.Tensor,
                            rollout: _Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_add_returns_and_advantages``: the old values, the returns and the GAE advantages, as tensors."""
    with torch.no_grad():
        chunks = list(_split(len(indices), algorithm.max_batchsize, shuffle=False))
        critic = _forward(algorithm.critic)
        v_s = torch.cat([critic(obs[chunk]) for chunk in chunks], dim=0).flatten()
        v_s_next = torch.cat([critic(obs_next[chunk]) for chunk in chunks], dim=0).flatten()
    v_s_np, v_s_next_np = v_s.cpu().numpy(), v_s_next.cpu().numpy()
    if algorithm.return_scaling:
        v_s_np = v_s_np * np.sqrt(algorithm.ret_rms.var + algorithm._eps)
        v_s_next_np = v_s_next_np * np.sqrt(algorithm.ret_rms.var + algorithm._eps)
    returns, advantages = algorithm.compute_episodic_return(rollout, buffer, indices, v_s_next_np, v_s_np,
                                                            gamma=algorithm.gamma, gae_lambda=algorithm.gae_lambda)
    if algorithm.return_scaling:
        unnormalized = returns
        returns = unnormalized / np.sqrt(algorithm.ret_rms.var + algorithm._eps)
        algorithm.ret_rms.update(unnormalized)
    return v_s, torch.as_tensor(returns).to(v_s), torch.as_tensor(advantages).to(v_s)


def _split(length: int, size: int, shuffle: bool):
    """The index arrays of ``Batch.split(size, shuffle, merge_last=True)`` (the same permutation draw)."""
    size = length if size == -1 else size
    if size < 1:
        raise ValueError(f"batch_size must be at least 1 (or None/-1: the whole batch), got {size}")
    order = np.random.permutation(length) if shuffle else np.arange(length)
    merge_last = length % size > 0
    for start in range(0, length, size):
        if merge_last and start + 2 * size >= length:
            yield order[start:]
            return
        yield order[start:start + size]


def _policy_dist(policy, obs: torch.Tensor):
    """``policy(batch).dist`` of a ``ProbabilisticActorPolicy`` within a training step, with its
    ``dist.sample()`` (unused here, drawn so the random stream stays Tianshou's). Tianshou's default
    ``dist_fn_categorical_from_logits`` is ``Categorical(logits=...)``: its ops without the object's
    argument checks (:class:`~rlaccel_plugins.fused.distributions.FlatCategorical`)."""
    from tianshou.algorithm.modelfree.reinforce import dist_fn_categorical_from_logits

    logits, _ = _forward(policy.actor)(obs)
    dist = FlatCategorical(logits) if policy.dist_fn is dist_fn_categorical_from_logits else policy.dist_fn(logits)
    dist.sample()
    return dist


# ---------------------------------------------------------------------------------- flat forwards
def _forward(module: torch.nn.Module) -> Callable:
    """``module``'s forward for the float32 tensors the fused updates pass: the same tensor ops without
    module calls for Tianshou's networks of Linear/ReLU/Tanh layers (same values, same autograd graph),
    else the module itself (other layers, or a hook registered: autocast's, a user's). Built once per
    module and rebuilt when its tree changes (``rlaccel_plugins.fused.module_cache``)."""
    return cached(module, "forward", lambda: _flat_forward(module) or module, _epoch)


def _flat_forward(module: torch.nn.Module) -> Callable | None:
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    build = {Net: _flat_net, ContinuousCritic: _flat_critic, ContinuousActorDeterministic: _flat_deterministic_actor,
             ContinuousActorProbabilistic: _flat_probabilistic_actor, DiscreteActor: _flat_discrete_actor,
             DiscreteCritic: _flat_discrete_critic}.get(type(module))
    return build(module) if build is not None else None


def _flat_mlp(mlp: torch.nn.Module, containers: list[torch.nn.Module]) -> Callable | None:
    """``MLP.forward`` on a float32 tensor of its device (``torch.as_tensor`` is the identity there)."""
    from tianshou.utils.net.common import MLP

    if type(mlp) is not MLP:
        return None
    layers = flat_layers([*containers, mlp], mlp.model)
    if layers is None or not mlp.flatten_input:
        return layers
    return lambda x: layers(x.flatten(1))


def _flat_net(net: torch.nn.Module, containers: tuple = ()) -> Callable | None:
    """``Net.forward(obs, state)``: its MLP, then the atoms' view and the softmax (not dueling)."""
    from tianshou.utils.net.common import Net

    if type(net) is not Net or net.use_dueling:
        return None
    mlp = _flat_mlp(net.model, [*containers, net])
    if mlp is None:
        return None
    atoms, softmax = net.num_atoms, net.softmax

    def forward(obs: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        logits = mlp(obs)
        if atoms > 1:
            logits = logits.view(logits.shape[0], -1, atoms)
        if softmax:
            logits = torch.softmax(logits, dim=-1)
        return logits, state

    return forward


def _preprocess_and_last(network: torch.nn.Module) -> tuple[Callable, Callable] | None:
    """The ``preprocess`` Net and the ``last`` MLP of one of Tianshou's actors or critics, flat; None
    where either has to stay a module."""
    preprocess, last = _flat_net(network.preprocess, (network,)), _flat_mlp(network.last, [network])
    return None if preprocess is None or last is None else (preprocess, last)


def _flat_critic(critic: torch.nn.Module) -> Callable | None:
    """``ContinuousCritic.forward(obs, act)``."""
    parts = _preprocess_and_last(critic)
    if parts is None:
        return None
    preprocess, last = parts
    obs_only = critic.apply_preprocess_net_to_obs_only

    def forward(obs: torch.Tensor, act: torch.Tensor | None = None) -> torch.Tensor:
        if obs_only:
            obs, _ = preprocess(obs)
        obs = obs.flatten(1)
        if act is not None:
            obs = torch.cat([obs, act.flatten(1)], dim=1)
        if not obs_only:
            obs, _ = preprocess(obs)
        return last(obs)

    return forward


def _flat_actor(actor: torch.nn.Module, output: Callable[[torch.Tensor], torch.Tensor]) -> Callable | None:
    """An actor's ``forward(obs, state)``: ``output(last(preprocess(obs)))`` and the preprocess's state."""
    parts = _preprocess_and_last(actor)
    if parts is None:
        return None
    preprocess, last = parts

    def forward(obs: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        x, hidden = preprocess(obs, state)
        return output(last(x)), hidden

    return forward


def _flat_deterministic_actor(actor: torch.nn.Module) -> Callable | None:
    """``ContinuousActorDeterministic.forward(obs)``: ``max_action * tanh(last(preprocess(obs)))``."""
    return _flat_actor(actor, lambda x: actor.max_action * torch.tanh(x))


def _flat_discrete_actor(actor: torch.nn.Module) -> Callable | None:
    """``DiscreteActor.forward(obs)``: ``last(preprocess(obs))``, softmax-ed if the actor says so."""
    if actor.softmax_output:
        return _flat_actor(actor, lambda x: torch.nn.functional.softmax(x, dim=-1))
    return _flat_actor(actor, lambda x: x)


def _flat_discrete_critic(critic: torch.nn.Module) -> Callable | None:
    """``DiscreteCritic.forward(obs)``: ``last(preprocess(obs))``."""
    parts = _preprocess_and_last(critic)
    if parts is None:
        return None
    preprocess, last = parts
    return lambda obs: last(preprocess(obs)[0])


def _flat_probabilistic_actor(actor: torch.nn.Module) -> Callable | None:
    """``ContinuousActorProbabilistic.forward(obs)``: the Gaussian's ``(mu, sigma)``."""
    from tianshou.utils.net.continuous import SIGMA_MAX, SIGMA_MIN

    preprocess, mu_net = _flat_net(actor.preprocess, (actor,)), _flat_mlp(actor.mu, [actor])
    sigma_net = _flat_mlp(actor.sigma, [actor]) if actor._c_sigma else None
    if preprocess is None or mu_net is None or (actor._c_sigma and sigma_net is None):
        return None

    def forward(obs: torch.Tensor, state: Any = None) -> tuple[tuple[torch.Tensor, torch.Tensor], Any]:
        logits, _ = preprocess(obs, state)
        mu = mu_net(logits)
        if not actor._unbounded:
            mu = actor.max_action * torch.tanh(mu)
        if sigma_net is not None:
            sigma = torch.clamp(sigma_net(logits), min=SIGMA_MIN, max=SIGMA_MAX).exp()
        else:
            shape = [1] * len(mu.shape)
            shape[1] = -1
            sigma = (actor.sigma_param.view(shape) + torch.zeros_like(mu)).exp()
        return (mu, sigma), state

    return forward


MODE_FREE = (torch.nn.Linear, torch.nn.Sequential, torch.nn.ModuleList, torch.nn.Identity, torch.nn.Flatten,
             torch.nn.ReLU, torch.nn.Tanh, torch.nn.ELU, torch.nn.LeakyReLU, torch.nn.SiLU, torch.nn.GELU,
             torch.nn.Sigmoid, torch.nn.Softmax, torch.nn.LayerNorm)  # layers that ignore .training


def _mode_free(*models: torch.nn.Module) -> bool:
    """Whether ``models`` compute the same in train and eval mode (Tianshou's networks of such layers)."""
    return all(cached(model, "mode_free", functools.partial(_tree_mode_free, model), _epoch) for model in models)


def _tree_mode_free(model: torch.nn.Module) -> bool:
    from tianshou.utils.net.common import MLP, Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    containers = (Net, MLP, ContinuousActorDeterministic, ContinuousActorProbabilistic, ContinuousCritic,
                  DiscreteActor, DiscreteCritic)
    return all(type(m) in containers or type(m) in MODE_FREE for m in model.modules())


def _obs_next(buffer, indices: np.ndarray) -> np.ndarray:
    """``buffer[indices].obs_next`` without building the rest of the batch."""
    if buffer._save_obs_next:
        return buffer.obs_next[indices]
    return buffer.obs[buffer.next(indices)]


class _FirstBatch:
    """What the wrapper's layer trace reads from the first training batch."""

    def __init__(self, obs: np.ndarray, act: np.ndarray) -> None:
        self.obs, self.act = obs, act
