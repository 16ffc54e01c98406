"""Fused ``update()`` for Tianshou algorithms: the same math as the algorithm's own, in fewer ops.

Tianshou's DQN update (``Algorithm._update``) samples a ``Batch`` of every field, computes n-step
returns over a copy of the whole buffer's ``done`` flags, runs the Q-network through the policy's
``forward`` (which also takes an argmax to numpy it does not need here) and builds ``Batch`` objects
along the way. The fused update draws the same indices (``buffer.sample_indices``: the same RNG
draws), reads only the fields the loss needs, computes the end flags only at the indices the n-step
sum visits and hands them to Tianshou's own ``_nstep_return``, runs the network modules directly,
and steps the optimizer through Tianshou's own ``Algorithm.Optimizer`` with PyTorch's multi-tensor
(``foreach``) Adam. Equal to Tianshou's update, tested step by step (``tests/test_tianshou_fused.py``).

Fused: ``DQN`` (plain and double, Huber or MSE, any n-step, with or without a target network) on a
Tianshou ``Net``, with buffers of array observations, ``stack_num=1`` and without prioritized
replay. Anything else runs Tianshou's own update.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlaccel_plugins.fused import OptimizerKernels

SUPPORTED = ("DQN",)


def fused_update_for(algorithm) -> Callable[[Any, Any, int | None], Any] | None:
    """``update(wrapper, buffer, sample_size)`` fusing ``algorithm``'s update, or None where there is
    no equivalence-tested one."""
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.utils.net.common import Net

    if type(algorithm) is not DQN or type(algorithm.policy) is not DiscreteQLearningPolicy \
            or type(algorithm.policy.model) is not Net:
        return None
    return _dqn_update


def fusable_buffer(buffer) -> bool:
    """Whether the fused update reads ``buffer`` as Tianshou would (else the update runs Tianshou's own)."""
    if buffer is None or hasattr(buffer, "update_weight") or getattr(buffer, "stack_num", 1) != 1:
        return False
    obs = buffer._meta.get("obs", None) if len(buffer) else None
    return isinstance(obs, np.ndarray)


def _dqn_update(wrapper, buffer, sample_size: int | None):
    """``Algorithm._update`` of the wrapper around a DQN, fused (see the module docstring)."""
    from tianshou.algorithm.algorithm_base import Algorithm, _nstep_return
    from tianshou.algorithm.modelfree.dqn import SimpleLossTrainingStats
    from tianshou.utils.torch_utils import torch_train_mode

    dqn = wrapper.wrapped_algorithm
    if not dqn.policy.is_within_training_step:
        raise RuntimeError("update() must be called within policy_within_training_step (as Tianshou's own)")
    start_time = time.time()
    wrapper._last_buffer = buffer
    if hasattr(buffer, "_last_weights"):
        buffer._last_weights = None
    indices = buffer.sample_indices(sample_size)  # the draws buffer.sample() makes
    weight = getattr(buffer, "_last_weights", None)

    # n-step returns: Algorithm.compute_nstep_return, reading only what it reads
    stacked = [indices]
    for _ in range(dqn.n_step - 1):
        stacked.append(buffer.next(stacked[-1]))
    stacked = np.stack(stacked)
    after_n = stacked[-1]
    model, device = dqn.policy.model, next(dqn.parameters()).device
    mode_free = _mode_free(model)
    with torch.no_grad():
        obs_next = torch.as_tensor(_obs_next(buffer, after_n), device=device, dtype=torch.float32)
        online, _ = model(obs_next)
        if dqn.use_target_network:  # the lagged copy switches itself to eval mode first, unless that changes nothing
            target_q = (dqn.model_old.module if mode_free else dqn.model_old)(obs_next)[0]
        else:
            target_q = online
        if dqn.is_double:
            target_q = target_q[np.arange(len(after_n)), online.argmax(dim=1).cpu().numpy()]
        else:
            target_q = target_q.max(dim=1)[0]
    count = len(indices)
    target_q_np = target_q.reshape(count, -1).cpu().numpy()
    target_q_np *= Algorithm.value_mask(buffer, after_n).reshape(-1, 1)
    end_flags = buffer.done[stacked] | np.isin(stacked, buffer.unfinished_index())  # buffer.done.copy(), only here
    positions = np.arange(stacked.size).reshape(stacked.shape)
    returns_np = _nstep_return(buffer.rew[stacked].reshape(-1), end_flags.reshape(-1), target_q_np, positions,
                               dqn.gamma, dqn.n_step)
    returns = torch.as_tensor(returns_np, device=target_q.device).to(target_q.dtype)

    obs = buffer.obs[indices]
    act = buffer.act[indices]
    # the train/eval switch walks every module twice per update (~15% of it); it changes nothing for a
    # network whose layers compute the same in both modes, so such a network skips it
    with contextlib.nullcontext() if mode_free else torch_train_mode(wrapper):
        wrapper._ensure_attached(_FirstBatch(obs, act))
        with wrapper._autocast(), OptimizerKernels([dqn.optim._optim]):
            dqn._periodically_update_lagged_network_weights()
            q = model(torch.as_tensor(obs, device=device, dtype=torch.float32))[0]
            q = q[np.arange(len(q)), act]
            returns = returns.flatten().to(q.dtype)
            td_error = returns - q
            if dqn.huber_loss_delta is not None:
                loss = torch.nn.functional.huber_loss(q.reshape(-1, 1), returns.reshape(-1, 1),
                                                      delta=dqn.huber_loss_delta, reduction="mean")
            else:
                w = 1.0 if weight is None else torch.as_tensor(weight, device=target_q.device).to(target_q.dtype)
                loss = (td_error.pow(2) * w).mean()
            dqn.optim.step(loss)
        stats = wrapper._stats(SimpleLossTrainingStats(loss=loss.item()))
    for lr_scheduler in wrapper.lr_schedulers:
        lr_scheduler.step()
    stats.train_time = time.time() - start_time
    return stats


MODE_FREE = (torch.nn.Linear, torch.nn.Sequential, torch.nn.ModuleList, torch.nn.Identity, torch.nn.Flatten,
             torch.nn.ReLU, torch.nn.Tanh, torch.nn.ELU, torch.nn.LeakyReLU, torch.nn.SiLU, torch.nn.GELU,
             torch.nn.Sigmoid, torch.nn.Softmax, torch.nn.LayerNorm)  # layers that ignore .training


def _mode_free(model: torch.nn.Module) -> bool:
    """Whether ``model`` computes the same in train and eval mode (Tianshou's Net/MLP of such layers)."""
    from tianshou.utils.net.common import MLP, Net

    return all(type(m) in (Net, MLP) or type(m) in MODE_FREE for m in model.modules())


def _obs_next(buffer, indices: np.ndarray) -> np.ndarray:
    """``buffer[indices].obs_next`` without building the rest of the batch."""
    if buffer._save_obs_next:
        return buffer.obs_next[indices]
    return buffer.obs[buffer.next(indices)]


class _FirstBatch:
    """What the wrapper's layer trace reads from the first training batch."""

    def __init__(self, obs: np.ndarray, act: np.ndarray) -> None:
        self.obs, self.act = obs, act
