"""Fused ``train()`` of the value-based algorithms: DQN and QR-DQN (the target network is fixed for the
call, so all targets of a chunk come from one forward)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces

from rlaccel_plugins.fused import OptimizerKernels, zero_grad
from rlaccel_plugins.fused.compiled_step import CompiledStep, built, guard_of
from rlaccel_plugins.fused.flat import apply_layers
from rlaccel_plugins.fused.kernels import clip_grad_norm
from rlaccel_plugins.fused.module_cache import new_epoch
from rlaccel_plugins.fused.module_cache import parameters as module_parameters
from rlaccel_sb3 import flat_actor_critic as flat
from rlaccel_sb3.fused.batches import Batches, flatten_steps, iter_batches, step_of
from rlaccel_sb3.fused.common import GraphsPerModel, compiled_steps, mean_of, replay_loops, step_key
from rlaccel_sb3.training_mode import set_training_mode


def _value_train(model, gradient_steps: int, batch_size: int, targets_of: Callable, loss_of: Callable,
                 graphs: GraphsPerModel, network_of: Callable, fused_optimizer: bool = False,
                 compiled_of: Callable | None = None) -> None:
    """DQN-style ``train()``: the target network is fixed for the call, so all targets come first.
    ``network_of()``: the online network's forward for the call (DQN's as flat layers where it can be);
    ``compiled_of()``: the call's :class:`CompiledStep`, or None (each step then runs eagerly). A
    compiled step computes its batch's target itself (the same rows: a target forward of 64 rows in the
    step is cheaper than a share of a batched one), so the batched targets are made only for eager steps."""
    policy = model.policy
    set_training_mode(policy, True)
    model._update_learning_rate(policy.optimizer)
    losses = []
    if gradient_steps > 0:
        parameters = module_parameters(policy)
        optimizers = [policy.optimizer]
        network = network_of()

        def step(observations, actions, target, weights=None):
            loss, weighted = loss_of(model, network, observations, actions, target, weights, batch_size)
            zero_grad(policy.optimizer)
            weighted.backward()
            if model.max_grad_norm is not None:
                clip_grad_norm(parameters, model.max_grad_norm)
            steps.optimizer_step(policy.optimizer)
            return (loss.detach(),)

        def one_by_one(batches: Batches, discounts) -> list[torch.Tensor]:
            """The chunk's steps one at a time: compiled where the whole network trains (not a sparse/dense
            step), else eagerly, on targets made for the whole chunk on the first eager step."""
            out, targets = [], None
            for i in range(batches.k):
                observations, actions = batches.step(i)
                weights = () if batches.weights is None else (batches.weights[i],)
                if compiled is not None and all(p.requires_grad for p in parameters):
                    out.append(compiled(observations, actions, step_of(batches.next_observations, i),
                                        batches.rewards[i], batches.dones[i],
                                        discounts[i] if torch.is_tensor(discounts) else discounts, *weights))
                else:
                    if targets is None:
                        with torch.no_grad():
                            targets = targets_of(model, batches, discounts, batches.k, batch_size)
                    inputs = (observations, actions, targets[i], *weights)
                    out += steps.run(step_key(steps, parameters, optimizers, inputs), inputs)
            return out

        steps = graphs.get(step, optimizers, isinstance(model.observation_space, spaces.Dict))
        compiled = compiled_of() if compiled_of is not None else None
        with OptimizerKernels(optimizers, fused=fused_optimizer):
            for batches in iter_batches(model, gradient_steps, batch_size):
                discounts = batches.discounts if batches.discounts is not None else model.gamma
                if compiled is not None and replay_loops(model, compiled, batches.k, parameters):
                    losses.extend(compiled.steps(*_stacked(batches, discounts)).unbind())  # the chunk as one call
                else:
                    losses.extend(one_by_one(batches, discounts))
        graphs.finish(optimizers)
        if compiled is not None:
            compiled.flush()
    model._n_updates += gradient_steps
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model.logger.record("train/loss", mean_of(losses) if losses else np.nan)


def _stacked(batches: Batches, discounts) -> tuple:
    """The chunk's rows as a compiled loop reads them: step ``j`` of each is step ``j``'s input."""
    if not torch.is_tensor(discounts):
        discounts = torch.full((batches.k,), float(discounts))
    weights = () if batches.weights is None else (batches.weights,)
    return (batches.observations, batches.actions, batches.next_observations, batches.rewards, batches.dones,
            discounts, *weights)


# rows per target-network forward: a 256-unit layer's activations for 2,048 rows (2 MB) stay in the CPU's
# cache, where one forward of 128 batches of 64 would stream 8 MB through memory (the same rows, bit for bit)
TARGET_ROWS = 2048


def _target_forward(network: Callable, observations) -> torch.Tensor:
    """``network(observations)`` over every step's batch, in chunks of ``TARGET_ROWS`` rows."""
    flat_observations = flatten_steps(observations)
    if isinstance(flat_observations, dict) or len(flat_observations) <= TARGET_ROWS:
        return network(flat_observations)
    return torch.cat([network(part) for part in flat_observations.split(TARGET_ROWS)])


# The math of each algorithm, written once: the eager fused step (batched targets for a chunk of steps) and the
# compiled one (a batch's target inside the step) call the same functions, each SB3's ops in SB3's order.
def _dqn_target(next_q: torch.Tensor, rewards, dones, discounts, shape: tuple[int, ...]) -> torch.Tensor:
    """SB3's DQN target from the target network's Q-values (``shape``: the rows' layout, one or k batches)."""
    return rewards + (1 - dones) * discounts * next_q.max(dim=1).values.reshape(shape)


def _dqn_td_loss(q_values: torch.Tensor, actions, target, weights) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, weighted)``: SB3's smooth-L1 loss of the taken actions' Q-values, and its importance-weighted
    mean where the tiered buffer gives weights (the loss itself otherwise)."""
    current = torch.gather(q_values, dim=1, index=actions.long())
    if weights is None:
        loss = F.smooth_l1_loss(current, target)
        return loss, loss
    per_sample = F.smooth_l1_loss(current, target, reduction="none")
    return per_sample.mean(), (per_sample * weights.view(-1, 1).to(per_sample.dtype)).mean()


def _qrdqn_target(next_quantiles: torch.Tensor, rewards, dones, discounts, rows: int, shape: tuple[int, ...]):
    """sb3-contrib's QR-DQN target: the greedy action's quantiles by their mean (``next_quantiles``: rows x
    quantiles x actions; ``shape``: the target's layout, one or k batches)."""
    n_quantiles = next_quantiles.shape[1]
    greedy = next_quantiles.mean(dim=1, keepdim=True).argmax(dim=2, keepdim=True).expand(rows, n_quantiles, 1)
    next_quantiles = next_quantiles.gather(dim=2, index=greedy).squeeze(dim=2).reshape(shape)
    return rewards + (1 - dones) * discounts * next_quantiles


def _quantile_td_loss(quantiles: torch.Tensor, actions, target, weights) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, weighted)``: sb3-contrib's quantile Huber loss of the taken actions' quantiles, and its
    importance-weighted mean where the tiered buffer gives weights."""
    from sb3_contrib.common.utils import quantile_huber_loss

    batch, n_quantiles = quantiles.shape[:2]
    index = actions[..., None].long().expand(batch, n_quantiles, 1)
    current = torch.gather(quantiles, dim=2, index=index).squeeze(dim=2)
    if weights is None:
        loss = quantile_huber_loss(current, target, sum_over_quantiles=True)
        return loss, loss
    return _weighted_quantile_huber(current, target, weights)


def _dqn_targets(model, batches: Batches, discounts, k: int, batch_size: int) -> torch.Tensor:
    next_q = _target_forward(model.q_net_target, batches.next_observations)
    return _dqn_target(next_q, batches.rewards, batches.dones, discounts, (k, -1, 1))


def _dqn_loss(model, q_net: Callable, observations, actions, target, weights, batch_size: int):
    return _dqn_td_loss(q_net(observations), actions, target, weights)


def _qrdqn_targets(model, batches: Batches, discounts, k: int, batch_size: int) -> torch.Tensor:
    next_quantiles = _target_forward(model.quantile_net_target, batches.next_observations)
    return _qrdqn_target(next_quantiles, batches.rewards, batches.dones, discounts, k * batch_size, (k, batch_size, -1))


def _qrdqn_loss(model, quantile_net: Callable, observations, actions, target, weights, batch_size: int):
    return _quantile_td_loss(quantile_net(observations), actions, target, weights)


def _weighted_quantile_huber(current: torch.Tensor, target: torch.Tensor, weights: torch.Tensor):
    """sb3-contrib's ``quantile_huber_loss(sum_over_quantiles=True)`` per sample, then weighted."""
    n_quantiles = current.shape[-1]
    cum_prob = (torch.arange(n_quantiles, device=current.device, dtype=torch.float) + 0.5) / n_quantiles
    cum_prob = cum_prob.view(1, -1, 1)
    pairwise_delta = target.unsqueeze(-2) - current.unsqueeze(-1)
    abs_pairwise_delta = torch.abs(pairwise_delta)
    huber_loss = torch.where(abs_pairwise_delta > 1, abs_pairwise_delta - 0.5, pairwise_delta**2 * 0.5)
    per_sample = (torch.abs(cum_prob - (pairwise_delta.detach() < 0).float()) * huber_loss).sum(dim=-2).mean(dim=-1)
    return per_sample.mean(), (per_sample * weights.to(per_sample.dtype)).mean()


def _dqn_compiled_loss(params: list[torch.Tensor], kinds: tuple[str, ...], target_params: list[torch.Tensor],
                       observations: torch.Tensor, actions: torch.Tensor, next_observations: torch.Tensor,
                       rewards: torch.Tensor, dones: torch.Tensor, discounts, weights: torch.Tensor | None = None):
    """:func:`_dqn_targets` then :func:`_dqn_loss` for one batch, as a pure function of the Q-network's
    parameters (a compiled step's ``loss_of``)."""
    with torch.no_grad():
        target = _dqn_target(apply_layers(kinds, target_params, next_observations.float()), rewards, dones, discounts,
                             (-1, 1))
    loss, weighted = _dqn_td_loss(apply_layers(kinds, params, observations.float()), actions, target, weights)
    return weighted, loss.detach()


def _qrdqn_compiled_loss(params: list[torch.Tensor], kinds: tuple[str, ...], shape: tuple[int, int],
                         target_params: list[torch.Tensor], observations: torch.Tensor, actions: torch.Tensor,
                         next_observations: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor, discounts,
                         weights: torch.Tensor | None = None):
    """:func:`_qrdqn_targets` then :func:`_qrdqn_loss` for one batch (``shape``: quantiles, actions), as a pure
    function of the quantile network's parameters (a compiled step's ``loss_of``)."""
    n_quantiles, n_actions = shape
    batch = len(observations)
    with torch.no_grad():
        next_quantiles = apply_layers(kinds, target_params, next_observations.float()).view(-1, n_quantiles, n_actions)
        target = _qrdqn_target(next_quantiles, rewards, dones, discounts, batch, (batch, -1))
    quantiles = apply_layers(kinds, params, observations.float()).view(-1, n_quantiles, n_actions)
    loss, weighted = _quantile_td_loss(quantiles, actions, target, weights)
    return weighted, loss.detach()


def compiled_dqn_step(model, compile: bool = True) -> CompiledStep | str:
    """DQN's gradient step compiled whole (:mod:`rlaccel_plugins.fused.compiled_step`), or why it cannot be."""
    return _compiled_value_step(model, model.q_net, model.q_net_target, flat.q_network_spec, _dqn_compiled_loss, (),
                                "Q-network", compile)


def compiled_qrdqn_step(model, compile: bool = True) -> CompiledStep | str:
    """QR-DQN's gradient step compiled whole (the DQN loop with sb3-contrib's quantile loss), or why not."""
    shape = (model.n_quantiles, int(model.action_space.n))
    return _compiled_value_step(model, model.quantile_net, model.quantile_net_target, flat.quantile_network_spec,
                                _qrdqn_compiled_loss, (shape,), "quantile network", compile)


def _compiled_value_step(model, network, target_network, spec_of: Callable, loss_of: Callable, constants: tuple,
                         name: str, compile: bool) -> CompiledStep | str:
    """A value-based algorithm's compiled step: ``loss_of(params, kinds, *constants, target_params, *inputs)``
    on the MLP ``network`` (:func:`~rlaccel_sb3.flat_actor_critic.q_network_spec`'s kind), or why it cannot be."""
    optimizer = model.policy.optimizer
    if model.device.type != "cpu":
        return "not on the CPU (CUDA graphs run there)"
    spec = spec_of(network)
    if spec is None:
        return f"the {name} is not an MLP of Linear/ReLU/Tanh layers on a 1-D Box (or a hook is registered)"
    kinds, params = spec
    target = spec_of(target_network)
    if target is None or target[0] != kinds:
        return f"the target {name} is not the {name}'s shape of MLP (or a hook is registered)"
    if [id(p) for g in optimizer.param_groups for p in g["params"]] != [id(p) for p in params]:
        return f"the optimizer does not hold exactly the {name}'s parameters"
    return built(lambda: CompiledStep(loss_of, params, optimizer, static=(kinds, *constants,
                                                                         [p.detach() for p in target[1]]),
                                      max_grad_norm=model.max_grad_norm, guard=guard_of(optimizer), compile=compile),
                 [optimizer])


def dqn_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[..., None]:
    compiled_of = compiled_steps(model, graphs)

    def train(gradient_steps: int, batch_size: int = 100) -> None:
        _value_train(model, gradient_steps, batch_size, _dqn_targets, _dqn_loss, graphs,
                     lambda: flat.q_values(model.q_net, new_epoch()), fused_optimizer, compiled_of)
    return train


def qrdqn_train(model, graphs: GraphsPerModel, fused_optimizer: bool) -> Callable[..., None]:
    compiled_of = compiled_steps(model, graphs)

    def train(gradient_steps: int, batch_size: int = 100) -> None:
        _value_train(model, gradient_steps, batch_size, _qrdqn_targets, _qrdqn_loss, graphs,
                     lambda: model.quantile_net, fused_optimizer, compiled_of)
    return train
