"""Fused updates of the value-based algorithms: DQN (plain and double, Huber or MSE, any n-step, with or
without a target network) and QR-DQN, on a Tianshou ``Net``; DQN's gradient step also compiled whole
(``training.compiled_updates``: :func:`compiled_dqn_step`)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rlaccel_plugins.fused.compiled_step import CompiledStep, built, guard_of
from rlaccel_plugins.fused.flat import apply_layers
from rlaccel_tianshou.flat_networks import (
    first_parameter,
    forward_of,
    is_mode_free,
    lagged,
    net_spec,
)
from rlaccel_tianshou.fused.common import (
    algorithm_step,
    as_input,
    nstep_returns,
    plain_step,
    training,
    weights_of,
)


def dqn_learn(wrapper, dqn, buffer, indices: np.ndarray, weight):
    """DQN's ``_preprocess_batch`` + ``_update_with_batch``."""
    from tianshou.algorithm.modelfree.dqn import SimpleLossTrainingStats

    model = dqn.policy.model
    mode_free = is_mode_free(model)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        online, _ = forward_of(model)(obs_next)
        target_q = forward_of(lagged(dqn.model_old, mode_free))(obs_next)[0] if dqn.use_target_network else online
        if dqn.is_double:  # Tianshou indexes with the argmax as numpy arrays: the same values
            return target_q.gather(1, online.argmax(dim=1, keepdim=True)).squeeze(1)
        return target_q.max(dim=1)[0]

    returns = nstep_returns(dqn, buffer, indices, dqn.n_step, target_q_of)
    obs, act = buffer.obs[indices], buffer.act[indices]
    with training(wrapper, dqn, [model], obs, act):
        dqn._periodically_update_lagged_network_weights()
        compiled = wrapper.compiled_step()
        if compiled is not None:
            weights = () if weight is None or dqn.huber_loss_delta is not None else (weights_of(weight, returns),)
            loss = compiled(as_input(dqn, obs), torch.as_tensor(act, dtype=torch.long, device=returns.device),
                            returns.flatten(), *weights)
            compiled.flush()
            return wrapper._stats(SimpleLossTrainingStats(loss=loss.item()))
        q = forward_of(model)(as_input(dqn, obs))[0]
        q = q.gather(1, torch.as_tensor(act, dtype=torch.long, device=q.device).reshape(-1, 1)).squeeze(1)
        returns = returns.flatten().to(q.dtype)
        if dqn.huber_loss_delta is not None:
            loss = torch.nn.functional.huber_loss(q.reshape(-1, 1), returns.reshape(-1, 1),
                                                  delta=dqn.huber_loss_delta, reduction="mean")
        else:
            loss = ((returns - q).pow(2) * weights_of(weight, returns)).mean()
        algorithm_step(dqn.optim, loss)
    return wrapper._stats(SimpleLossTrainingStats(loss=loss.item()))


def _dqn_compiled_loss(params: list[torch.Tensor], kinds: tuple[str, ...], huber_loss_delta: float | None,
                       obs: torch.Tensor, act: torch.Tensor, returns: torch.Tensor, weight: torch.Tensor | None = None):
    """:func:`dqn_learn`'s loss once the n-step returns are there, as a pure function of the Q-network's
    parameters (a compiled step's ``loss_of``; the Huber loss, as Tianshou's, takes no importance weights)."""
    q = apply_layers(kinds, params, obs.flatten(1)).gather(1, act.reshape(-1, 1)).squeeze(1)
    returns = returns.to(q.dtype)
    if huber_loss_delta is not None:
        loss = F.huber_loss(q.reshape(-1, 1), returns.reshape(-1, 1), delta=huber_loss_delta, reduction="mean")
    else:
        loss = ((returns - q).pow(2) * (1.0 if weight is None else weight)).mean()
    return loss, loss.detach()


def compiled_dqn_step(dqn, compile: bool = True) -> CompiledStep | str:
    """DQN's gradient step compiled whole (:mod:`rlaccel_plugins.fused.compiled_step`): the loss on the
    n-step returns, backward, Tianshou's clip and the Adam step; or why it cannot be."""
    model = dqn.policy.model
    if first_parameter(model).device.type != "cpu":
        return "not on the CPU"
    spec = net_spec(model)
    if spec is None:
        return "the Q-network is not a Net of Linear/ReLU/Tanh layers (one atom, no softmax or dueling) without hooks"
    kinds, params = spec
    if not plain_step(dqn.optim):
        return "the algorithm's optimizer has a step of its own"
    optimizer = dqn.optim._optim
    if [id(p) for g in optimizer.param_groups for p in g["params"]] != [id(p) for p in params]:
        return "the optimizer does not hold exactly the Q-network's parameters"
    return built(lambda: CompiledStep(_dqn_compiled_loss, params, optimizer, static=(kinds, dqn.huber_loss_delta),
                                      max_grad_norm=dqn.optim._max_grad_norm, guard=guard_of(optimizer),
                                      compile=compile), [optimizer])


def qrdqn_learn(wrapper, qrdqn, buffer, indices: np.ndarray, weight):
    """QRDQN's ``_preprocess_batch`` + ``_update_with_batch`` (the quantile Huber loss)."""
    from tianshou.algorithm.modelfree.dqn import SimpleLossTrainingStats

    model = qrdqn.policy.model
    mode_free = is_mode_free(model)

    def target_q_of(obs_next: torch.Tensor) -> torch.Tensor:
        online, _ = forward_of(model)(obs_next)
        act = online.mean(2).argmax(dim=1).cpu().numpy()
        next_dist = forward_of(lagged(qrdqn.model_old, mode_free))(obs_next)[0] if qrdqn.use_target_network else online
        return next_dist[np.arange(len(act)), act, :]

    returns = nstep_returns(qrdqn, buffer, indices, qrdqn.n_step, target_q_of)
    obs, act = buffer.obs[indices], buffer.act[indices]
    with training(wrapper, qrdqn, [model], obs, act):
        qrdqn._periodically_update_lagged_network_weights()
        curr_dist = forward_of(model)(as_input(qrdqn, obs))[0]
        curr_dist = curr_dist[np.arange(len(act)), act, :].unsqueeze(2)
        target_dist = returns.unsqueeze(1)
        dist_diff = torch.nn.functional.smooth_l1_loss(target_dist, curr_dist, reduction="none")
        huber_loss = (dist_diff * (qrdqn.tau_hat - (target_dist - curr_dist).detach().le(0.0).float()).abs()) \
            .sum(-1).mean(1)
        loss = (huber_loss * weights_of(weight, returns)).mean()
        algorithm_step(qrdqn.optim, loss)
    return wrapper._stats(SimpleLossTrainingStats(loss=loss.item()))


def dqn_eligible(algorithm) -> bool:
    """Whether ``algorithm`` (a Tianshou ``DQN``) is one the fused update covers: its policy's Q-network a ``Net``."""
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.utils.net.common import Net

    return type(algorithm.policy) is DiscreteQLearningPolicy and type(algorithm.policy.model) is Net


def qrdqn_eligible(algorithm) -> bool:
    """Whether ``algorithm`` (a Tianshou ``QRDQN``) is one the fused update covers: its quantile network a ``Net``."""
    from tianshou.algorithm.modelfree.qrdqn import QRDQNPolicy
    from tianshou.utils.net.common import Net

    return type(algorithm.policy) is QRDQNPolicy and type(algorithm.policy.model) is Net
