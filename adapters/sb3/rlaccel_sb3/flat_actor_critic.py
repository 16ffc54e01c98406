"""SB3's off-policy actors, critics and DQN's Q-network as flat functions: the same tensor ops, without
module calls.

A fused SAC gradient step calls SB3's actor twice and its critic and target critic three times —
about 60 module calls of a few µs of Python each (hook checks, ``__call__`` dispatch) — and builds a
``Normal`` distribution twice, with its argument checks. At SAC's default of one gradient step per
``train()`` call that costs about what the fused step saves elsewhere. For the networks of SB3's
``MlpPolicy`` (a 1-D Box observation, the flatten extractor, Linear/ReLU/Tanh layers, no gSDE) these
functions compute the same values through the same ops — ``F.linear`` on the same parameters, SB3's
squashed diagonal Gaussian as ``Normal.rsample``'s ``normal_`` draw, ``Normal.log_prob`` in its own op
order and the tanh correction — so the autograd graph and the gradients are the same (tested bit for
bit with the fused SAC, TD3 and DDPG updates). Elsewhere, or where a forward or backward hook is
registered, they are the modules' own methods. What they give is kept per network until its tree
changes (``rlaccel_plugins.fused.module_cache``).

One difference, documented: ``Normal``'s argument check no longer raises on a NaN mean or standard
deviation; the NaN reaches the loss, where the gradient guard sees it.

Examples:
    >>> import torch
    >>> from stable_baselines3 import SAC
    >>> model = SAC("MlpPolicy", "Pendulum-v1", seed=0)
    >>> obs = torch.randn(4, 3)
    >>> _ = torch.manual_seed(1)
    >>> actions, log_prob = action_log_prob(model.actor)(obs)
    >>> _ = torch.manual_seed(1)
    >>> own_actions, own_log_prob = model.actor.action_log_prob(obs)
    >>> torch.equal(actions, own_actions) and torch.equal(log_prob, own_log_prob)
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from stable_baselines3.common.distributions import sum_independent_dims

from rlaccel_plugins.fused.distributions import normal_log_prob, normal_rsample
from rlaccel_plugins.fused.flat import flat_layers
from rlaccel_plugins.fused.module_cache import cached


def action_log_prob(actor: torch.nn.Module, epoch: int | None = None) -> Callable:
    """SAC's ``actor.action_log_prob(obs)``: a squashed-Gaussian sample and its log-probability."""
    return cached(actor, "sb3.action_log_prob", lambda: _action_log_prob(actor) or actor.action_log_prob, epoch)


def actor_forward(actor: torch.nn.Module, epoch: int | None = None) -> Callable:
    """TD3/DDPG's ``actor(obs)``: the deterministic action."""
    return cached(actor, "sb3.actor_forward", lambda: _actor_forward(actor) or actor, epoch)


def critic_forward(critic: torch.nn.Module, epoch: int | None = None) -> Callable:
    """``critic(obs, actions)``: the tuple of every Q-network's values."""
    return cached(critic, "sb3.critic_forward", lambda: _critic(critic, first_only=False) or critic, epoch)


def critic_q1(critic: torch.nn.Module, epoch: int | None = None) -> Callable:
    """``critic.q1_forward(obs, actions)``: the first Q-network's values."""
    return cached(critic, "sb3.critic_q1", lambda: _critic(critic, first_only=True) or critic.q1_forward, epoch)


def q_values(q_net: torch.nn.Module, epoch: int | None = None) -> Callable:
    """DQN's ``q_net(obs)`` (SB3's ``QNetwork``): every action's Q-value."""
    return cached(q_net, "sb3.q_values", lambda: flat_q_values(q_net) or q_net, epoch)


def _around(network: torch.nn.Module, *methods: str) -> list[torch.nn.Module] | None:
    """The modules whose calls a flat function of ``network`` skips (the network, its flatten extractor),
    where the network takes a 1-D Box observation through SB3's ``FlattenExtractor`` and no instance
    overrides ``methods``; else None."""
    from gymnasium import spaces
    from stable_baselines3.common.torch_layers import FlattenExtractor

    extractor, space = getattr(network, "features_extractor", None), getattr(network, "observation_space", None)
    if type(extractor) is not FlattenExtractor or not isinstance(space, spaces.Box) or len(space.shape) != 1 \
            or any(name in network.__dict__ for name in methods):
        return None
    return [network, extractor, extractor.flatten]  # preprocess_obs is .float(), Flatten the identity


def _action_log_prob(actor: torch.nn.Module) -> Callable | None:
    from stable_baselines3.common.distributions import SquashedDiagGaussianDistribution
    from stable_baselines3.sac.policies import LOG_STD_MAX, LOG_STD_MIN, Actor

    around = _around(actor, "forward", "action_log_prob", "get_action_dist_params", "extract_features")
    if type(actor) is not Actor or actor.use_sde or around is None \
            or type(actor.action_dist) is not SquashedDiagGaussianDistribution:
        return None
    latent_pi, mu, log_std = (flat_layers(around, part) for part in (actor.latent_pi, actor.mu, actor.log_std))
    if latent_pi is None or mu is None or log_std is None:
        return None
    epsilon = actor.action_dist.epsilon

    def flat_action_log_prob(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        latent = latent_pi(obs.float())
        mean = mu(latent)
        std = torch.ones_like(mean) * torch.clamp(log_std(latent), LOG_STD_MIN, LOG_STD_MAX).exp()
        gaussian = normal_rsample(mean, std)
        actions = torch.tanh(gaussian)
        log_prob = gaussian_log_prob(gaussian, mean, std)
        log_prob -= torch.sum(torch.log(1 - actions**2 + epsilon), dim=1)  # the tanh correction
        return actions, log_prob

    return flat_action_log_prob


def flat_q_values(q_net: torch.nn.Module) -> Callable | None:
    """``q_net(obs)`` of an MLP ``QNetwork`` on a 1-D Box, as flat layers; None elsewhere or with a hook."""
    from stable_baselines3.dqn.policies import QNetwork

    return _extractor_then_mlp(q_net, QNetwork, "q_net")


def _actor_forward(actor: torch.nn.Module) -> Callable | None:
    from stable_baselines3.td3.policies import Actor

    return _extractor_then_mlp(actor, Actor, "mu")


def _extractor_then_mlp(network: torch.nn.Module, cls: type, mlp: str) -> Callable | None:
    """``network(obs)`` of a ``cls`` whose forward is the flatten extractor then its ``mlp`` Sequential."""
    around = _around(network, "forward", "extract_features")
    if type(network) is not cls or around is None:
        return None
    layers = flat_layers(around, getattr(network, mlp))
    return None if layers is None else (lambda obs: layers(obs.float()))


def _critic(critic: torch.nn.Module, first_only: bool) -> Callable | None:
    from stable_baselines3.common.policies import ContinuousCritic

    around = _around(critic, "forward", "q1_forward", "extract_features")
    if type(critic) is not ContinuousCritic or around is None:
        return None
    q_networks = [flat_layers(around, q_net) for q_net in critic.q_networks]
    if not q_networks or any(q is None for q in q_networks):
        return None
    if first_only:
        first = q_networks[0]
        return lambda obs, actions: first(torch.cat([obs.float(), actions], dim=1))

    def flat_critic(obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q_input = torch.cat([obs.float(), actions], dim=1)
        return tuple(q(q_input) for q in q_networks)

    return flat_critic


def gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``Normal(mean, std).log_prob(actions)`` in its op order (the order autograd sums ``std``'s gradients
    in), summed over the action dims as SB3 does."""
    return sum_independent_dims(normal_log_prob(actions, mean, std))
