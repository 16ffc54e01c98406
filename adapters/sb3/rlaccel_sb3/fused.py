"""Fused ``train()`` for SB3 algorithms: the same math as the algorithm's own, in fewer ops.

What changes against SB3's loop of ``gradient_steps`` (each: sample, target forward, online forward,
loss, ``.item()``, backward, clip, step):

- the ``gradient_steps`` batches are drawn first (in chunks of at most 64 MB of observations: all at
  once for vector observations, a few steps for Atari frames), by the buffer's own ``sample()`` called
  as many times, so every RNG (numpy's, the tiered sampler's) is consumed exactly as SB3 consumes
  it — and stacked into one tensor per field;
- DQN/QR-DQN's target network does not change inside ``train()`` (SB3 updates it in ``_on_step``), so
  the targets of a chunk's batches come from **one** forward pass of the target network;
- on a CUDA device each gradient step is a captured CUDA graph (``rlaccel_plugins.fused.graphs``);
- the optimizer and the gradient clipping run PyTorch's multi-tensor (``foreach``) kernels (the same
  arithmetic, one kernel per op for all parameters); losses are logged once per call, no ``.item()``
  per step;
- importance weights of the tiered buffer are applied in the loss directly (SB3's own path scales
  the output gradients through a hook);
- SAC's, TD3's and DDPG's ``MlpPolicy`` actors and critics run as flat functions of the same tensor
  ops, without module calls or distribution objects (``rlaccel_sb3.flat_actor_critic``).

Equal to SB3's ``train()``, tested step by step (losses, gradients, parameters, optimizer state, RNG):
see ``tests/equivalence/test_sb3_fused.py`` for the tolerance and where the op order differs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.utils import explained_variance

from rlaccel_plugins.fused import OptimizerKernels, optimizer_step, zero_grad
from rlaccel_plugins.fused.graphs import StepGraphs, graphs_possible
from rlaccel_plugins.fused.kernels import backward_to, clip_grad_norm
from rlaccel_plugins.fused.module_cache import new_epoch
from rlaccel_plugins.fused.module_cache import parameters as module_parameters
from rlaccel_sb3 import flat_actor_critic as flat
from rlaccel_sb3.collection import evaluate_actions_of
from rlaccel_sb3.rollout_batches import rollout_batches
from rlaccel_sb3.training_mode import set_training_mode

SUPPORTED = ("DQN", "QRDQN", "SAC", "TD3", "DDPG", "PPO", "A2C")  # algorithms with an equivalence-tested fused train()


def fused_train_for(model, guard=None, cuda_graphs: bool = True,
                    fused_optimizer: bool = False) -> Callable[..., None] | None:
    """The fused ``train`` of ``model``'s algorithm, with SB3's signature (``(gradient_steps, batch_size)``
    off-policy, ``()`` on-policy), or None where there is no equivalence-tested one (an algorithm
    subclass that overrides ``train`` has none).

    On a CUDA device DQN, QR-DQN, SAC, TD3 and DDPG steps run as captured CUDA graphs
    (:class:`~rlaccel_plugins.fused.graphs.StepGraphs`) unless ``cuda_graphs=False``; ``guard`` is the
    :class:`~rlaccel_plugins.updates.guard.GradientGuard` the caller attaches to the model's optimizers
    (checked on the device there). With ``fused_optimizer=True`` (``training.fused_optimizer``) the
    optimizers step with PyTorch's single-kernel ``fused=True`` implementation instead of the multi-tensor
    one: faster on the CPU, rounded differently (equal to SB3's within the tolerance
    ``tests/equivalence/test_sb3_fused.py`` states). The returned function's ``release()`` drops the graphs and puts
    the optimizers' kernels back (the callback calls it when it removes the override).
    """
    from stable_baselines3 import A2C, DQN, PPO, SAC, TD3

    own = type(model).train
    graphs = _GraphsPerModel(model, guard, cuda_graphs)
    if own is DQN.train:
        def train(gradient_steps: int, batch_size: int = 100) -> None:
            _value_train(model, gradient_steps, batch_size, _dqn_targets, _dqn_loss, graphs,
                         lambda: flat.q_values(model.q_net, new_epoch()), fused_optimizer)
    elif own is SAC.train:
        def train(gradient_steps: int, batch_size: int = 100) -> None:
            _sac_train(model, gradient_steps, batch_size, graphs, fused_optimizer)
    elif own is TD3.train:  # DDPG too: SB3's DDPG is TD3 with one critic and no delay
        def train(gradient_steps: int, batch_size: int = 100) -> None:
            _td3_train(model, gradient_steps, batch_size, graphs, fused_optimizer)
    elif own is PPO.train:
        def train() -> None:
            _ppo_train(model, fused_optimizer)
    elif own is A2C.train:
        def train() -> None:  # SB3's own, with the multi-tensor kernels and the lean evaluate_actions
            _a2c_train(model, fused_optimizer)
    elif own is _qrdqn_train():
        def train(gradient_steps: int, batch_size: int = 100) -> None:
            _value_train(model, gradient_steps, batch_size, _qrdqn_targets, _qrdqn_loss, graphs,
                         lambda: model.quantile_net, fused_optimizer)
    else:
        return None
    train.__doc__ = f"rlaccel's fused {type(model).__name__}.train (same math, fewer ops)"
    train.release = graphs.release
    train.graphs = graphs
    return train


class _GraphsPerModel:
    """The model's :class:`StepGraphs` (one per step function), kept from one ``train()`` call to the
    next — a captured graph holds the addresses of the parameters, gradients and optimizer state — and
    dropped when those change (``optimizer.load_state_dict``) or on :meth:`release`."""

    def __init__(self, model, guard, cuda_graphs: bool) -> None:
        self.model, self.guard, self.cuda_graphs = model, guard, cuda_graphs
        self.steps: StepGraphs | None = None
        self.reason: str | None = None  # why the steps run eagerly on a CUDA device
        self._fingerprint: tuple | None = None

    def get(self, step: Callable, optimizers: list, dict_observations: bool) -> StepGraphs:
        """The graphs for ``step`` (built on the first call; ``step`` must be the same function each time)."""
        if self.steps is not None and self.steps.enabled and _fingerprint(optimizers) != self._fingerprint:
            self.release()
        if self.steps is None:
            enabled = self.cuda_graphs and self.model.device.type == "cuda"
            if enabled:
                self.reason = graphs_possible(optimizers, self.guard) or (
                    "dict observations" if dict_observations else None) or (
                    "gSDE" if getattr(self.model, "use_sde", False) else None)
                enabled = self.reason is None
            self.steps = StepGraphs(step, optimizers, enabled=enabled, guard=self.guard).apply()
        self.steps.step = step
        return self.steps

    def finish(self, optimizers: list) -> None:
        """End of a ``train()`` call: the guard's device counters, and the storage the graphs hold."""
        if self.steps is not None and self.steps.enabled:  # eager steps hold no storage addresses
            self.steps.flush()
            self._fingerprint = _fingerprint(optimizers)

    @property
    def captured(self) -> int:
        return self.steps.captured if self.steps is not None else 0

    def release(self) -> None:
        if self.steps is not None:
            self.steps.restore()
            self.steps = None


def _fingerprint(optimizers: list) -> tuple:
    """The storage of every parameter and optimizer-state tensor: what a captured graph has baked in."""
    return tuple((p.data_ptr(), *(v.data_ptr() for v in o.state.get(p, {}).values() if torch.is_tensor(v)))
                 for o in optimizers for g in o.param_groups for p in g["params"])


def _step_key(steps: StepGraphs, parameters: list, optimizers: list, inputs: tuple, *branches) -> tuple | None:
    """What changes a captured step (None when nothing is captured): which parameters get gradients
    (the sparse/dense phase), the learning rates, the inputs' shapes (constants: their values), and the
    caller's host-side branches."""
    if not steps.enabled:
        return None
    return (tuple(p.requires_grad for p in parameters), tuple(g["lr"] for o in optimizers for g in o.param_groups),
            tuple(x.shape if torch.is_tensor(x) else x for x in inputs), *branches)


def _qrdqn_train():
    try:
        from sb3_contrib import QRDQN
    except ImportError:  # sb3-contrib is optional
        return None
    return QRDQN.train


# ---------------------------------------------------------------------------------------- batches
class _Batches:
    """``gradient_steps`` replay samples stacked: field tensors of shape ``(k, batch, ...)``."""

    def __init__(self, observations, actions, next_observations, dones, rewards, discounts=None,
                 weights: torch.Tensor | None = None) -> None:
        self.observations, self.actions, self.next_observations = observations, actions, next_observations
        self.dones, self.rewards, self.discounts, self.weights = dones, rewards, discounts, weights
        self.k = len(actions)

    @classmethod
    def stacked(cls, samples: list, weights: list[np.ndarray | None]) -> _Batches:
        first = samples[0]
        return cls(_stack([s.observations for s in samples]), torch.stack([s.actions for s in samples]),
                   _stack([s.next_observations for s in samples]), torch.stack([s.dones for s in samples]),
                   torch.stack([s.rewards for s in samples]),
                   torch.stack([s.discounts for s in samples]) if first.discounts is not None else None,
                   None if weights[0] is None else torch.as_tensor(np.stack(weights), device=first.rewards.device))

    def step(self, i: int) -> tuple[Any, torch.Tensor]:
        return _index(self.observations, i), self.actions[i]


CHUNK_BYTES = 64 * 2**20  # the most observation bytes drawn ahead at once (Atari frames: a few steps)


def iter_batches(model, gradient_steps: int, batch_size: int):
    """:func:`draw_batches` for ``gradient_steps`` steps in chunks of at most ``CHUNK_BYTES`` of
    observations: all of them at once for vector observations, a few steps at a time for images (one
    gather of 100 batches of 512 Atari frames would be 2.9 GB). The draws keep SB3's order."""
    per_step = max(1, 2 * batch_size * _observation_bytes(model.observation_space))
    chunk = max(1, min(gradient_steps, CHUNK_BYTES // per_step))
    for start in range(0, gradient_steps, chunk):
        yield draw_batches(model, min(chunk, gradient_steps - start), batch_size)


def _observation_bytes(space) -> int:
    if isinstance(space, spaces.Dict):
        return sum(_observation_bytes(s) for s in space.spaces.values())
    return int(np.prod(space.shape or (1,))) * np.dtype(space.dtype or np.float32).itemsize


def draw_batches(model, gradient_steps: int, batch_size: int) -> _Batches:
    """Sample as SB3's ``train()`` would over ``gradient_steps`` steps, all at once."""
    from stable_baselines3.common.buffers import ReplayBuffer

    buffer = model.replay_buffer
    if type(buffer) is ReplayBuffer and model._vec_normalize_env is None:
        return _draw_from_replay_buffer(buffer, gradient_steps, batch_size)
    samples, weights = [], []
    applied_by = getattr(buffer, "weights_applied_by", None)
    if hasattr(buffer, "weights_applied_by"):
        buffer.weights_applied_by = draw_batches  # the fused loss applies the importance weights itself
    try:
        for _ in range(gradient_steps):
            samples.append(buffer.sample(batch_size, env=model._vec_normalize_env))
            weights.append(getattr(buffer, "last_weights", None))
    finally:
        if hasattr(buffer, "weights_applied_by"):
            buffer.weights_applied_by = applied_by
    return _Batches.stacked(samples, weights)


def _draw_from_replay_buffer(buffer, k: int, batch_size: int) -> _Batches:
    """SB3's own ``ReplayBuffer.sample`` ``k`` times — the same numpy draws in the same order — with
    the rows gathered once for all ``k`` batches instead of once per batch."""
    rows, envs = [], []
    for _ in range(k):
        if not buffer.optimize_memory_usage:
            rows.append(np.random.randint(0, buffer.buffer_size if buffer.full else buffer.pos, size=batch_size))
        elif buffer.full:
            rows.append((np.random.randint(1, buffer.buffer_size, size=batch_size) + buffer.pos) % buffer.buffer_size)
        else:
            rows.append(np.random.randint(0, buffer.pos, size=batch_size))
        envs.append(np.random.randint(0, high=buffer.n_envs, size=(batch_size,)))
    b, e = np.concatenate(rows), np.concatenate(envs)
    if buffer.optimize_memory_usage:
        next_obs = buffer.observations[(b + 1) % buffer.buffer_size, e, :]
    else:
        next_obs = buffer.next_observations[b, e, :]
    dones = (buffer.dones[b, e] * (1 - buffer.timeouts[b, e])).reshape(-1, 1)

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=buffer.device).reshape(k, batch_size, *array.shape[1:])

    return _Batches(tensor(buffer.observations[b, e, :]), tensor(buffer.actions[b, e, :]), tensor(next_obs),
                    tensor(dones), tensor(buffer.rewards[b, e].reshape(-1, 1)))


def _stack(values: list) -> Any:
    if isinstance(values[0], dict):
        return {key: torch.stack([v[key] for v in values]) for key in values[0]}
    return torch.stack(values)


def _index(value: Any, i: int) -> Any:
    return {key: v[i] for key, v in value.items()} if isinstance(value, dict) else value[i]


def _flat(value: Any) -> Any:
    """``(k, batch, ...)`` → ``(k * batch, ...)``."""
    if isinstance(value, dict):
        return {key: v.reshape(-1, *v.shape[2:]) for key, v in value.items()}
    return value.reshape(-1, *value.shape[2:])


# ---------------------------------------------------------------------------------------- value-based
def _value_train(model, gradient_steps: int, batch_size: int, targets_of: Callable, loss_of: Callable,
                 graphs: _GraphsPerModel, network_of: Callable, fused_optimizer: bool = False) -> None:
    """DQN-style ``train()``: the target network is fixed for the call, so all targets come first.
    ``network_of()``: the online network's forward for the call (DQN's as flat layers where it can be)."""
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

        steps = graphs.get(step, optimizers, isinstance(model.observation_space, spaces.Dict))
        with OptimizerKernels(optimizers, fused=fused_optimizer):
            for batches in iter_batches(model, gradient_steps, batch_size):
                discounts = batches.discounts if batches.discounts is not None else model.gamma
                with torch.no_grad():
                    targets = targets_of(model, batches, discounts, batches.k, batch_size)
                for i in range(batches.k):
                    observations, actions = batches.step(i)
                    inputs = (observations, actions, targets[i])
                    if batches.weights is not None:
                        inputs += (batches.weights[i],)
                    (loss,) = steps.run(_step_key(steps, parameters, optimizers, inputs), inputs)
                    losses.append(loss)
        graphs.finish(optimizers)
    model._n_updates += gradient_steps
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model.logger.record("train/loss", _mean(losses) if losses else np.nan)


def _dqn_targets(model, batches: _Batches, discounts, k: int, batch_size: int) -> torch.Tensor:
    next_q = model.q_net_target(_flat(batches.next_observations))
    next_q = next_q.max(dim=1).values.reshape(k, -1, 1)
    return batches.rewards + (1 - batches.dones) * discounts * next_q


def _dqn_loss(model, q_net: Callable, observations, actions, target, weights, batch_size: int):
    current = torch.gather(q_net(observations), dim=1, index=actions.long())
    if weights is None:
        loss = F.smooth_l1_loss(current, target)
        return loss, loss
    per_sample = F.smooth_l1_loss(current, target, reduction="none")
    return per_sample.mean(), (per_sample * weights.view(-1, 1).to(per_sample.dtype)).mean()


def _qrdqn_targets(model, batches: _Batches, discounts, k: int, batch_size: int) -> torch.Tensor:
    next_quantiles = model.quantile_net_target(_flat(batches.next_observations))
    greedy = next_quantiles.mean(dim=1, keepdim=True).argmax(dim=2, keepdim=True)
    greedy = greedy.expand(k * batch_size, model.n_quantiles, 1)
    next_quantiles = next_quantiles.gather(dim=2, index=greedy).squeeze(dim=2).reshape(k, batch_size, -1)
    return batches.rewards + (1 - batches.dones) * discounts * next_quantiles


def _qrdqn_loss(model, quantile_net: Callable, observations, actions, target, weights, batch_size: int):
    from sb3_contrib.common.utils import quantile_huber_loss

    current = quantile_net(observations)
    index = actions[..., None].long().expand(batch_size, model.n_quantiles, 1)
    current = torch.gather(current, dim=2, index=index).squeeze(dim=2)
    if weights is None:
        loss = quantile_huber_loss(current, target, sum_over_quantiles=True)
        return loss, loss
    return _weighted_quantile_huber(current, target, weights)


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


# ---------------------------------------------------------------------------------------- actor-critic
def _critic_losses(current: tuple[torch.Tensor, ...], target: torch.Tensor, weights: torch.Tensor | None):
    """SB3's ``sum(F.mse_loss(q, target) for q in current)``, and the loss to backpropagate: the same,
    or each critic's squared errors weighted per sample (what the importance-weight hook computes)."""
    loss = sum(F.mse_loss(q, target) for q in current)
    if weights is None:
        return loss, loss
    w = weights.view(-1, 1).to(target.dtype)
    return loss, sum((w * (q - target) ** 2).mean() for q in current)


def _mean(values: list[torch.Tensor]) -> float:
    """``np.mean`` of the values' ``.item()``s, as SB3 logs them (one host sync per call, not per step)."""
    return np.mean(torch.stack(values).double().cpu().numpy())


def _td3_train(model, gradient_steps: int, batch_size: int, graphs: _GraphsPerModel,
               fused_optimizer: bool = False) -> None:
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
                noise = noise.clamp(-model.target_noise_clip, model.target_noise_clip)
                next_actions = (target_actor_f(next_observations) + noise).clamp(-1, 1)
                next_q = torch.cat(target_critic_f(next_observations, next_actions), dim=1)
                next_q, _ = torch.min(next_q, dim=1, keepdim=True)
                target = rewards + (1 - dones) * discounts * next_q
            critic_loss, weighted = _critic_losses(critic_f(observations, actions), target, weights)
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
        with OptimizerKernels(optimizers, fused=fused_optimizer):
            for batches, i in _each_step(model, gradient_steps, batch_size):
                model._n_updates += 1
                update_actor = model._n_updates % model.policy_delay == 0
                inputs = _actor_critic_inputs(model, batches, i)
                steps.step = functools.partial(step, update_actor=update_actor)
                outputs = steps.run(_step_key(steps, parameters, optimizers, inputs, update_actor), inputs)
                critic_losses.append(outputs[0])
                if update_actor:
                    actor_losses.append(outputs[1])
        graphs.finish(optimizers)
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    if actor_losses:
        model.logger.record("train/actor_loss", _mean(actor_losses))
    model.logger.record("train/critic_loss", _mean(critic_losses) if critic_losses else np.nan)


def _each_step(model, gradient_steps: int, batch_size: int):
    """``(batches, i)`` for every gradient step: step ``i`` of the chunk ``batches``."""
    for batches in iter_batches(model, gradient_steps, batch_size):
        for i in range(batches.k):
            yield batches, i


def _actor_critic_inputs(model, batches: _Batches, i: int) -> tuple:
    """Step ``i``'s tensors, in the order the actor-critic step functions take them."""
    observations, actions = batches.step(i)
    discounts = batches.discounts[i] if batches.discounts is not None else model.gamma
    inputs = (observations, actions, _index(batches.next_observations, i), batches.rewards[i], batches.dones[i],
              discounts)
    return inputs + (batches.weights[i],) if batches.weights is not None else inputs


def _sac_train(model, gradient_steps: int, batch_size: int, graphs: _GraphsPerModel,
               fused_optimizer: bool = False) -> None:
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
                ent_coef_loss = -(model.log_ent_coef * (log_prob + model.target_entropy).detach()).mean()
                outputs = (ent_coef_loss.detach(),)
                zero_grad(model.ent_coef_optimizer)
                ent_coef_loss.backward()
                steps.optimizer_step(model.ent_coef_optimizer)
            else:
                ent_coef = model.ent_coef_tensor
            outputs += (ent_coef.detach().reshape(()),)
            with torch.no_grad():
                next_actions, next_log_prob = sample_f(next_observations)
                next_q = torch.cat(target_critic_f(next_observations, next_actions), dim=1)
                next_q, _ = torch.min(next_q, dim=1, keepdim=True)
                next_q = next_q - ent_coef * next_log_prob.reshape(-1, 1)
                target = rewards + (1 - dones) * discounts * next_q
            critic_loss, weighted = _critic_losses(critic_f(observations, actions), target, weights)
            critic_loss, weighted = 0.5 * critic_loss, 0.5 * weighted
            zero_grad(critic.optimizer)
            weighted.backward()
            steps.optimizer_step(critic.optimizer)
            q_values_pi = torch.cat(critic_f(observations, actions_pi), dim=1)
            min_qf_pi, _ = torch.min(q_values_pi, dim=1, keepdim=True)
            actor_loss = (ent_coef * log_prob - min_qf_pi).mean()
            zero_grad(actor.optimizer)
            backward_to(actor_loss, actor.optimizer)  # not into the critics' weights: never applied
            steps.optimizer_step(actor.optimizer)
            if update_target:
                polyak_update_(*critic_pairs, model.tau)
                polyak_update_(model.batch_norm_stats, model.batch_norm_stats_target, 1.0)
            return (*outputs, critic_loss.detach(), actor_loss.detach())

        steps = graphs.get(step, optimizers, isinstance(model.observation_space, spaces.Dict))
        with OptimizerKernels(optimizers, fused=fused_optimizer):
            for gradient_step, (batches, i) in enumerate(_each_step(model, gradient_steps, batch_size)):
                update_target = gradient_step % model.target_update_interval == 0
                inputs = _actor_critic_inputs(model, batches, i)
                steps.step = functools.partial(step, update_target=update_target)
                outputs = steps.run(_step_key(steps, parameters, optimizers, inputs, update_target), inputs)
                if tuned:
                    ent_coef_losses.append(outputs[0])
                ent_coefs.append(outputs[-3])
                critic_losses.append(outputs[-2])
                actor_losses.append(outputs[-1])
        graphs.finish(optimizers)
    model._n_updates += gradient_steps
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    nan = np.nan
    model.logger.record("train/ent_coef", _mean(ent_coefs) if ent_coefs else nan)
    model.logger.record("train/actor_loss", _mean(actor_losses) if actor_losses else nan)
    model.logger.record("train/critic_loss", _mean(critic_losses) if critic_losses else nan)
    if ent_coef_losses:
        model.logger.record("train/ent_coef_loss", _mean(ent_coef_losses))


# ---------------------------------------------------------------------------------------- on-policy
def _a2c_train(model, fused_optimizer: bool = False) -> None:
    """SB3's ``A2C.train`` (one gradient step on the whole rollout), line for line, with the policy's
    train-mode flags written flat, its ``evaluate_actions`` as the same tensor ops without module calls
    where the policy is an MLP one (``rlaccel_sb3.collection.lean_evaluate_actions_for``), the parameter
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
    (``rlaccel_sb3.collection.lean_evaluate_actions_for``), the minibatches gathered with one copy per
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
    model.logger.record("train/entropy_loss", _mean(entropy_losses))
    model.logger.record("train/policy_gradient_loss", _mean(pg_losses))
    model.logger.record("train/value_loss", _mean(value_losses))
    model.logger.record("train/approx_kl", np.mean(torch.stack(approx_kl_divs).cpu().numpy()) if approx_kl_divs
                        else np.mean([]))
    model.logger.record("train/clip_fraction", _mean(clip_fractions))
    model.logger.record("train/loss", loss.item())
    model.logger.record("train/explained_variance", explained_var)
    if hasattr(policy, "log_std"):
        model.logger.record("train/std", torch.exp(policy.log_std).mean().item())
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model.logger.record("train/clip_range", clip_range)
    if clip_range_vf is not None:
        model.logger.record("train/clip_range_vf", clip_range_vf)
