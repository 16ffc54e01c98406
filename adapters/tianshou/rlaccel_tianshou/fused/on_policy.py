"""Fused update of PPO with Tianshou's discrete or continuous actors and critics: the whole buffer,
returns and advantages computed once, minibatches split as Tianshou splits them."""

from __future__ import annotations

import numpy as np
import torch

from rlaccel_plugins.fused.distributions import FlatCategorical
from rlaccel_tianshou.flat_networks import forward_of
from rlaccel_tianshou.fused.common import (
    algorithm_step,
    as_input,
    next_observations,
    on_nets,
    training,
)


def ppo_learn(wrapper, ppo, buffer, indices: np.ndarray, _weight, batch_size: int | None, repeat: int):
    """PPO's ``_preprocess_batch`` (GAE, old log-probabilities) + ``_update_with_batch``: each field
    converted to a tensor once, minibatches as index gathers of those tensors (Tianshou's ``Batch.split``
    indexes every field of the batch), the same shuffles and the same ``dist.sample()`` draws."""
    from tianshou.algorithm.modelfree.a2c import A2CTrainingStats
    from tianshou.data import SequenceSummaryStats

    if ppo.recompute_adv:
        ppo._buffer, ppo._indices = buffer, indices
    obs = as_input(ppo, buffer.obs[indices])
    obs_next = as_input(ppo, next_observations(buffer, indices))
    rollout = _Rollout(buffer, indices)
    v_s, returns, adv = _returns_and_advantages(ppo, buffer, indices, obs, obs_next, rollout)
    act = torch.as_tensor(buffer.act[indices]).to(v_s)
    with torch.no_grad():
        logp_old = torch.cat([_policy_dist(ppo.policy, obs[chunk]).log_prob(act[chunk])
                              for chunk in _split(len(indices), ppo.max_batchsize, shuffle=False)]).flatten()
    losses, clip_losses, vf_losses, ent_losses = [], [], [], []
    head = indices[:8]  # what the layer trace reads
    with training(wrapper, ppo, [ppo.policy.actor, ppo.critic], buffer.obs[head], buffer.act[head]):
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
                value = forward_of(ppo.critic)(obs[chunk]).flatten()
                if ppo.value_clip:
                    v_clip = v_s[chunk] + (value - v_s[chunk]).clamp(-ppo.eps_clip, ppo.eps_clip)
                    vf_loss = torch.max((returns[chunk] - value).pow(2), (returns[chunk] - v_clip).pow(2)).mean()
                else:
                    vf_loss = (returns[chunk] - value).pow(2).mean()
                ent_loss = dist.entropy().mean()
                loss = clip_loss + ppo.vf_coef * vf_loss - ppo.ent_coef * ent_loss
                algorithm_step(ppo.optim, loss)
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
        critic = forward_of(algorithm.critic)
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

    logits, _ = forward_of(policy.actor)(obs)
    dist = FlatCategorical(logits) if policy.dist_fn is dist_fn_categorical_from_logits else policy.dist_fn(logits)
    dist.sample()
    return dist


def ppo_eligible(algorithm) -> bool:
    """Whether ``algorithm`` (PPO) is covered: Tianshou's discrete or continuous probabilistic actor and its
    critic on ``Net``s."""
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy, ProbabilisticActorPolicy
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic, ContinuousCritic
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    return (type(algorithm.policy) in (ProbabilisticActorPolicy, DiscreteActorPolicy)
            and on_nets(algorithm.policy.actor, (DiscreteActor, ContinuousActorProbabilistic))
            and on_nets(algorithm.critic, (DiscreteCritic, ContinuousCritic)))
