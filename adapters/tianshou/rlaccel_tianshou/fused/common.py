"""What the fused Tianshou updates share: the update's frame (the same index draws as ``buffer.sample``,
the learning-rate schedulers, ``train_time``), n-step returns read at the indices they visit, the
training context, Tianshou's ``Algorithm.Optimizer.step`` and the Polyak update."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlaccel_plugins.fused import OptimizerKernels, optimizer_step, polyak_update_, zero_grad
from rlaccel_plugins.fused.kernels import backward_to, clip_grad_norm
from rlaccel_tianshou import flat_networks
from rlaccel_tianshou.buffer_reads import sample_indices, unfinished_index
from rlaccel_tianshou.flat_networks import first_parameter, is_mode_free, parameters_of


def on_nets(module: torch.nn.Module, classes: tuple[type, ...]) -> bool:
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


def off_policy_update(learn: Callable) -> Callable[[Any, Any, int | None], Any]:
    """``Algorithm._update`` of the wrapper, with ``learn(wrapper, algorithm, buffer, indices, weight)``
    in place of ``buffer.sample`` + ``_preprocess_batch`` + ``_update_with_batch`` (a ``partial`` of
    module-level functions, so a wrapper holding it pickles)."""
    return functools.partial(_run_update, learn)


def on_policy_update(learn: Callable) -> Callable[[Any, Any, int | None, int], Any]:
    """``OnPolicyAlgorithm.update(buffer, batch_size, repeat)`` of the wrapper: the whole buffer, in
    ``learn(wrapper, algorithm, buffer, indices, weight, batch_size, repeat)``."""
    return functools.partial(_run_on_policy_update, learn)


def _run_update(learn: Callable, wrapper, buffer, sample_size: int | None, *args):
    algorithm = wrapper.wrapped_algorithm
    if not algorithm.policy.is_within_training_step:
        raise RuntimeError("update() must be called within policy_within_training_step (as Tianshou's own)")
    start_time = time.time()
    wrapper._last_buffer = buffer
    if hasattr(buffer, "_last_weights"):
        buffer._last_weights = None
    indices = sample_indices(buffer, sample_size)  # the draws buffer.sample() makes
    flat_networks.next_epoch()
    try:
        stats = learn(wrapper, algorithm, buffer, indices, getattr(buffer, "_last_weights", None), *args)
    finally:
        flat_networks.end_epoch()
    for lr_scheduler in wrapper.lr_schedulers:
        lr_scheduler.step()
    stats.train_time = time.time() - start_time
    return stats


def _run_on_policy_update(learn: Callable, wrapper, buffer, batch_size: int | None, repeat: int):
    return _run_update(learn, wrapper, buffer, 0, batch_size, repeat)


def nstep_returns(algorithm, buffer, indices: np.ndarray, n_step: int,
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
        target_q = target_q_of(as_input(algorithm, next_observations(buffer, after_n)))
    target_q_np = target_q.reshape(len(indices), -1).cpu().numpy()
    target_q_np *= Algorithm.value_mask(buffer, after_n).reshape(-1, 1)
    unfinished = np.zeros(len(buffer.done), dtype=bool)  # np.isin(stacked, unfinished_index()), as a lookup
    unfinished[unfinished_index(buffer)] = True
    end_flags = buffer.done[stacked] | unfinished[stacked]  # buffer.done.copy(), only here
    positions = np.arange(stacked.size).reshape(stacked.shape)
    returns = _nstep_return(buffer.rew[stacked].reshape(-1), end_flags.reshape(-1), target_q_np, positions,
                            algorithm.gamma, n_step)
    return torch.as_tensor(returns, device=target_q.device).to(target_q.dtype)


def as_input(algorithm, array: np.ndarray) -> torch.Tensor:
    """What Tianshou's networks turn an observation or action array into (``torch.as_tensor(x, device,
    float32)``), done once instead of once per network call."""
    return torch.as_tensor(array, device=first_parameter(algorithm).device, dtype=torch.float32)


def weights_of(weight: np.ndarray | None, like: torch.Tensor) -> torch.Tensor | float:
    """``batch.weight`` as ``compute_nstep_return`` converts it (1.0 where the buffer gives none)."""
    return 1.0 if weight is None else torch.as_tensor(weight, device=like.device).to(like.dtype)


@contextlib.contextmanager
def training(wrapper, algorithm, modules: list[torch.nn.Module], obs: np.ndarray, act: np.ndarray):
    """The context ``_update_with_batch`` runs in: train mode, the wrapper's layer trace, guard and
    autocast, and multi-tensor optimizer kernels (single-kernel ones with ``training.fused_optimizer``)."""
    from tianshou.utils.torch_utils import torch_train_mode

    # the train/eval switch walks every module twice per update (a measurable share of a small one); it changes
    # nothing for networks whose layers compute the same in both modes, so such networks skip it
    with contextlib.nullcontext() if is_mode_free(*modules) else torch_train_mode(wrapper):
        attaching = wrapper.updater is not None and not wrapper.updater.attachments
        wrapper._ensure_attached(_FirstBatch(obs, act))
        # a compiled step writes the optimizer's state itself and refuses a single-kernel (fused=True) optimizer,
        # so where compiled steps are asked for, the eager steps between them keep the multi-tensor kernels
        kernels = OptimizerKernels([optimizer._optim for optimizer in algorithm._optimizers],
                                   fused=wrapper.rlaccel_config.training.fused_optimizer and not wrapper._compile)
        autocast = wrapper._autocast()
        with autocast, kernels:
            if attaching or type(autocast) is not contextlib.nullcontext:
                flat_networks.next_epoch()  # the layer trace's or autocast's hooks: the networks are checked again
            yield


def algorithm_step(optimizer, loss: torch.Tensor, own_gradients_only: bool = False) -> None:
    """Tianshou's ``Algorithm.Optimizer.step(loss)``: zero the gradients, backward, clip to its
    ``max_grad_norm``, step — the step as flat ops where :mod:`rlaccel_plugins.fused.flat_optim` covers it.
    ``own_gradients_only``: the backward computes only the optimizer's parameters' gradients (an actor's
    loss: not into the critics' weights, whose gradients Tianshou computes and never applies)."""
    if not plain_step(optimizer):  # a subclass's own step
        optimizer.step(loss)
        return
    zero_grad(optimizer._optim)
    if own_gradients_only:
        backward_to(loss, optimizer._optim)
    else:
        loss.backward()
    clip_and_step(optimizer)


def plain_step(optimizer) -> bool:
    from tianshou.algorithm.algorithm_base import Algorithm

    return type(optimizer).step is Algorithm.Optimizer.step


def clip_and_step(optimizer) -> None:
    """The rest of ``Algorithm.Optimizer.step`` once the gradients are there."""
    if optimizer._max_grad_norm is not None:
        clip_grad_norm(parameters_of(optimizer._module), optimizer._max_grad_norm)
    optimizer_step(optimizer._optim)


def polyak(algorithm) -> None:
    """``_update_lagged_network_weights`` of the Polyak mixin, as three multi-tensor ops."""
    pairs = algorithm._lagged_networks._lagged_network_pairs
    sources = [p for pair in pairs for p in parameters_of(pair.source)]
    targets = [p for pair in pairs for p in parameters_of(pair.target)]
    polyak_update_([p.data for p in sources], [p.data for p in targets], algorithm.tau, weighted_sum=True)


def next_observations(buffer, indices: np.ndarray) -> np.ndarray:
    """``buffer[indices].obs_next`` without building the rest of the batch."""
    if buffer._save_obs_next:
        return buffer.obs_next[indices]
    return buffer.obs[buffer.next(indices)]


class _FirstBatch:
    """What the wrapper's layer trace reads from the first training batch."""

    def __init__(self, obs: np.ndarray, act: np.ndarray) -> None:
        self.obs, self.act = obs, act
