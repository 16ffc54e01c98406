"""SB3's networks as flat functions — the same tensor ops, without module calls: the off-policy actors,
critics and DQN's Q-network (the fused SAC, TD3, DDPG and DQN updates, the lean collection), and the
on-policy ``ActorCriticPolicy``'s ``forward`` and ``evaluate_actions`` (PPO's and A2C's collection and
fused updates).

A fused SAC step calls SB3's actor twice and its critics three times, each a chain of module calls with
their hook checks, and builds a ``Normal`` twice with its argument checks. For the networks of SB3's
``MlpPolicy`` (a 1-D Box observation, the flatten extractor, Linear/ReLU/Tanh layers, no gSDE) these
functions compute the same values through the same ops — ``F.linear`` on the same parameters, SB3's
squashed diagonal Gaussian as ``Normal.rsample``'s ``normal_`` draw, ``Normal.log_prob`` in its own op
order and the tanh correction — so the autograd graph and the gradients are the same (tested bit for
bit with the fused updates). Elsewhere, or where a forward or backward hook is registered, they are
the modules' own methods. What they give is kept per network until its tree changes
(``rlaccel_plugins.fused.module_cache``).

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

import math
from collections.abc import Callable

import torch
from gymnasium import spaces
from stable_baselines3.common.distributions import sum_independent_dims

from rlaccel_plugins.fused.distributions import FlatCategorical, normal_log_prob, normal_rsample
from rlaccel_plugins.fused.flat import flat_layers, layer_spec
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


def _squashed_gaussian_actor(actor: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The modules a flat function of SAC's ``Actor`` skips (:func:`_around`), where it is SB3's own
    squashed-Gaussian actor without gSDE; else None."""
    from stable_baselines3.common.distributions import SquashedDiagGaussianDistribution
    from stable_baselines3.sac.policies import Actor

    around = _around(actor, "forward", "action_log_prob", "get_action_dist_params", "extract_features")
    if type(actor) is not Actor or actor.use_sde or around is None \
            or type(actor.action_dist) is not SquashedDiagGaussianDistribution:
        return None
    return around


def _action_log_prob(actor: torch.nn.Module) -> Callable | None:
    around = _squashed_gaussian_actor(actor)
    if around is None:
        return None
    latent_pi, mu, log_std = (flat_layers(around, part) for part in (actor.latent_pi, actor.mu, actor.log_std))
    if latent_pi is None or mu is None or log_std is None:
        return None
    epsilon = actor.action_dist.epsilon

    def flat_action_log_prob(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        latent = latent_pi(obs.float())
        mean = mu(latent)
        noise = torch.empty(mean.shape, dtype=mean.dtype, device=mean.device).normal_()  # Normal.rsample's draw
        return squashed_gaussian(mean, log_std(latent), noise, epsilon)

    return flat_action_log_prob


def critic_losses(current: list[torch.Tensor], target: torch.Tensor,
                  weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """SB3's critics' loss ``sum(F.mse_loss(q, target) for q in current)``, and the loss to differentiate: the
    same, or each critic's squared errors weighted per sample (what the importance-weight hook computes).
    The eager fused and the compiled SAC/TD3 steps both use it."""
    loss = sum(torch.nn.functional.mse_loss(q, target) for q in current)
    if weights is None:
        return loss, loss
    w = weights.view(-1, 1).to(target.dtype)
    return loss, sum((w * (q - target) ** 2).mean() for q in current)


def critics_target(next_q: list[torch.Tensor], rewards, dones, discounts,
                   entropy: torch.Tensor | None = None) -> torch.Tensor:
    """SB3's SAC and TD3 target: the smallest of the target critics' values (less SAC's ``ent_coef *
    log_prob`` of the next actions, ``entropy``), discounted onto the rewards where the episode goes on."""
    smallest, _ = torch.min(torch.cat(next_q, dim=1), dim=1, keepdim=True)
    if entropy is not None:
        smallest = smallest - entropy
    return rewards + (1 - dones) * discounts * smallest


def smoothed_target_actions(target_actions: torch.Tensor, noise: torch.Tensor, noise_clip: float) -> torch.Tensor:
    """TD3's target policy smoothing: the target actor's actions plus clipped noise, clipped to the action box."""
    return (target_actions + noise.clamp(-noise_clip, noise_clip)).clamp(-1, 1)


def sac_actor_loss(q_values: list[torch.Tensor], log_prob: torch.Tensor, ent_coef) -> torch.Tensor:
    """SB3's SAC actor loss: ``ent_coef * log_prob`` less the smallest critic's value of the actor's actions."""
    min_qf_pi, _ = torch.min(torch.cat(q_values, dim=1), dim=1, keepdim=True)
    return (ent_coef * log_prob - min_qf_pi).mean()


def ent_coef_loss(log_ent_coef: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """SB3's SAC entropy coefficient loss (the log-probabilities held fixed)."""
    return -(log_ent_coef * (log_prob + target_entropy).detach()).mean()


def squashed_gaussian(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor,
                      epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SB3's ``SquashedDiagGaussianDistribution`` sample for the standard-normal draw ``noise`` (its
    ``rsample``: ``mean + noise * std``) and its log-probability with the tanh correction, in its op order."""
    from stable_baselines3.sac.policies import LOG_STD_MAX, LOG_STD_MIN

    std = torch.ones_like(mean) * torch.clamp(log_std, LOG_STD_MIN, LOG_STD_MAX).exp()
    gaussian = mean + noise * std
    actions = torch.tanh(gaussian)
    log_prob = gaussian_log_prob(gaussian, mean, std)
    return actions, log_prob - torch.sum(torch.log(1 - actions**2 + epsilon), dim=1)  # the tanh correction


def flat_q_values(q_net: torch.nn.Module) -> Callable | None:
    """``q_net(obs)`` of an MLP ``QNetwork`` on a 1-D Box, as flat layers; None elsewhere or with a hook."""
    from stable_baselines3.dqn.policies import QNetwork

    return _extractor_then_mlp(q_net, QNetwork, "q_net")


def q_network_spec(q_net: torch.nn.Module) -> tuple[tuple[str, ...], list[torch.Tensor]] | None:
    """What :func:`flat_q_values` runs as data (:func:`~rlaccel_plugins.fused.flat.layer_spec`): the
    layer kinds and parameters of an MLP ``QNetwork`` on a 1-D Box (its input is ``obs.float()``)."""
    from stable_baselines3.dqn.policies import QNetwork

    found = _extractor_and_mlp(q_net, QNetwork, "q_net")
    return layer_spec(*found) if found is not None else None


def quantile_network_spec(quantile_net: torch.nn.Module) -> tuple[tuple[str, ...], list[torch.Tensor]] | None:
    """:func:`q_network_spec` for sb3-contrib's ``QuantileNetwork`` (its output viewed as
    ``(batch, n_quantiles, n_actions)``), or None."""
    from sb3_contrib.qrdqn.policies import QuantileNetwork

    found = _extractor_and_mlp(quantile_net, QuantileNetwork, "quantile_net")
    return layer_spec(*found) if found is not None else None


def td3_actor_spec(actor: torch.nn.Module) -> tuple[tuple[str, ...], list[torch.Tensor]] | None:
    """What :func:`actor_forward` runs as data for TD3's and DDPG's ``Actor`` (its ``mu`` MLP), or None."""
    from stable_baselines3.td3.policies import Actor

    found = _extractor_and_mlp(actor, Actor, "mu")
    return layer_spec(*found) if found is not None else None


def sac_actor_spec(actor: torch.nn.Module) -> tuple[tuple[str, ...], list[torch.Tensor], float] | None:
    """What :func:`action_log_prob` runs as data: the latent layers' kinds, every parameter in the actor's
    order (the latent layers', then ``mu``'s and ``log_std``'s weight and bias) and the tanh correction's
    epsilon; None where :func:`action_log_prob` would be the actor's own method."""
    around = _squashed_gaussian_actor(actor)
    if around is None:
        return None
    latent, mu, log_std = (layer_spec(around, part) for part in (actor.latent_pi, actor.mu, actor.log_std))
    if latent is None or mu is None or log_std is None:
        return None
    return latent[0], [*latent[1], *mu[1], *log_std[1]], actor.action_dist.epsilon


def critic_spec(critic: torch.nn.Module) -> tuple[tuple[str, ...], list[torch.Tensor], int] | None:
    """What :func:`critic_forward` runs as data: the Q-networks' layer kinds (all alike), their
    parameters in the critic's order and their number; None where it would be the critic's own call."""
    around = _critic_around(critic)
    if around is None:
        return None
    specs = [layer_spec(around, q_net) for q_net in critic.q_networks]
    if not specs or any(spec is None or spec[0] != specs[0][0] for spec in specs):
        return None
    return specs[0][0], [p for _, params in specs for p in params], len(specs)


def _actor_forward(actor: torch.nn.Module) -> Callable | None:
    from stable_baselines3.td3.policies import Actor

    return _extractor_then_mlp(actor, Actor, "mu")


def _extractor_and_mlp(network: torch.nn.Module, cls: type, mlp: str) -> tuple[list[torch.nn.Module], torch.nn.Module] | None:
    """The modules a flat call of ``network`` skips (:func:`_around`) and its ``mlp`` Sequential, where
    ``network`` is exactly a ``cls`` whose forward is the flatten extractor then that Sequential; else None.
    The one place both the flat functions and the compiled steps' layer data read such a network from."""
    around = _around(network, "forward", "extract_features")
    if type(network) is not cls or around is None:
        return None
    return around, getattr(network, mlp)


def _extractor_then_mlp(network: torch.nn.Module, cls: type, mlp: str) -> Callable | None:
    """``network(obs)`` of a ``cls`` whose forward is the flatten extractor then its ``mlp`` Sequential."""
    found = _extractor_and_mlp(network, cls, mlp)
    layers = flat_layers(*found) if found is not None else None
    return None if layers is None else (lambda obs: layers(obs.float()))


def _critic_around(critic: torch.nn.Module) -> list[torch.nn.Module] | None:
    """:func:`_around` for SB3's own ``ContinuousCritic`` (its forward and ``q1_forward`` not overridden)."""
    from stable_baselines3.common.policies import ContinuousCritic

    around = _around(critic, "forward", "q1_forward", "extract_features")
    return around if type(critic) is ContinuousCritic else None


def _critic(critic: torch.nn.Module, first_only: bool) -> Callable | None:
    around = _critic_around(critic)
    if around is None:
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


# ---------------------------------------------------------------------------------------- on-policy
def lean_policy_forward_for(model) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """A lean ``policy.forward`` for PPO/A2C's collection (SB3's ``ActorCriticPolicy.forward``: values,
    sampled actions and their log-probabilities) for an MLP policy on a 1-D Box observation, with a
    Discrete action space (SB3's ``Categorical``: the same ``torch.multinomial`` draw) or a Box one
    (its diagonal Gaussian: the same ``normal_`` draw), as the same tensor ops without the module calls
    and the distribution objects. None elsewhere (gSDE, images, dicts, other distributions)."""
    parts = _flat_actor_critic(model)
    if parts is None:
        return None
    actor, critic, categorical_actions = parts
    policy = model.policy
    action_shape = (-1, *model.action_space.shape)

    def categorical(logits: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        distribution = FlatCategorical(logits)
        actions = torch.argmax(distribution.probs, dim=1) if deterministic else distribution.sample()
        return actions, distribution.log_prob(actions)

    def gaussian(mean: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        std = _gaussian_std(mean, policy.log_std)
        if deterministic:
            actions = mean
        else:
            actions = normal_rsample(mean, std)
        return actions, gaussian_log_prob(actions, mean, std)

    sample = categorical if categorical_actions else gaussian

    def forward(obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = obs.float()
        values = critic(features)
        actions, log_prob = sample(actor(features), deterministic)
        return actions.reshape(action_shape), values, log_prob

    forward.__doc__ = f"rlaccel's lean {type(policy).__name__}.forward for collection (same ops, no module calls)"
    return forward


def lean_evaluate_actions_for(model) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """A lean ``policy.evaluate_actions(obs, actions)`` for PPO's and A2C's updates (values, log-probabilities of the
    actions, entropies), for the policies :func:`lean_policy_forward_for` serves: the same tensor ops —
    torch's ``Categorical`` (normalised logits, ``gather``, the clamped entropy over ``softmax``) or
    SB3's diagonal Gaussian (``Normal.log_prob`` and ``Normal.entropy`` summed over action dims) — so
    the same values and autograd graph, without module calls or distribution objects (nor their
    argument validation: a NaN logit reaches the loss, where the gradient guard sees it, instead of
    raising in ``Categorical``). None where a forward hook is registered (see :func:`evaluate_actions_of`)."""
    parts = _flat_actor_critic(model)
    if parts is None or "evaluate_actions" in model.policy.__dict__:  # a user's own stays
        return None
    actor, critic, categorical_actions = parts
    policy = model.policy

    def distribution(out: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if categorical_actions:
            return categorical_log_prob_entropy(out, actions)
        return gaussian_log_prob_entropy(out, policy.log_std, actions)

    def evaluate_actions(obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = obs.float()
        log_prob, entropy = distribution(actor(features), actions)
        return critic(features), log_prob, entropy

    return evaluate_actions


def evaluate_actions_of(model) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The ``evaluate_actions`` a fused PPO/A2C update calls: :func:`lean_evaluate_actions_for`'s, kept
    while the policy's module tree stays as it is (``module_cache``: building it is a sizeable share of
    A2C's one-step update), else the policy's own (a user's override included)."""
    policy = model.policy
    if "evaluate_actions" in policy.__dict__:
        return policy.evaluate_actions
    return cached(policy, "sb3.evaluate_actions", lambda: lean_evaluate_actions_for(model)) or policy.evaluate_actions


def categorical_log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SB3's ``CategoricalDistribution``: the actions' log-probabilities, then the entropies (log-probability
    first, as SB3 asks them: ``probs`` is made after it)."""
    distribution = FlatCategorical(logits)
    return distribution.log_prob(actions), distribution.entropy()


def gaussian_log_prob_entropy(mean: torch.Tensor, log_std: torch.Tensor,
                              actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SB3's ``DiagGaussianDistribution``: ``Normal.log_prob`` and ``Normal.entropy`` summed over the action
    dims, log-probability first (the order autograd sums the standard deviation's gradients in)."""
    std = _gaussian_std(mean, log_std)
    log_prob = gaussian_log_prob(actions, mean, std)
    entropy = 0.5 + 0.5 * math.log(2 * math.pi) + torch.log(std)  # Normal.entropy
    return log_prob, sum_independent_dims(entropy)


def _gaussian_std(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """SB3's ``DiagGaussianDistribution.proba_distribution`` standard deviation."""
    return torch.ones_like(mean) * log_std.exp()


def _flat_actor_critic(model) -> tuple[Callable, Callable, bool] | None:
    """The actor (to the action logits or means) and the critic (to the values) of an on-policy MLP policy
    (:func:`_on_policy_mlp`) as flat functions, and whether the actions are categorical; None elsewhere or
    where a forward hook is registered."""
    parts = _on_policy_mlp(model)
    if parts is None:
        return None
    hooked, actor_layers, critic_layers, categorical = parts
    actor, critic = flat_layers(hooked, *actor_layers), flat_layers(hooked, *critic_layers)
    if actor is None or critic is None:
        return None
    return actor, critic, categorical


def actor_critic_spec(model) -> tuple[tuple, tuple, list[torch.Tensor], list[torch.Tensor], bool] | None:
    """What :func:`lean_evaluate_actions_for` runs, as data (:func:`~rlaccel_plugins.fused.flat.layer_spec`):
    the actor's and the critic's layer kinds and parameters, and whether the actions are categorical (else
    a diagonal Gaussian with the policy's ``log_std``); None where it would be the policy's own method."""
    parts = _on_policy_mlp(model)
    if parts is None or "evaluate_actions" in model.policy.__dict__:
        return None
    hooked, actor_layers, critic_layers, categorical = parts
    actor, critic = layer_spec(hooked, *actor_layers), layer_spec(hooked, *critic_layers)
    if actor is None or critic is None:
        return None
    return actor[0], critic[0], actor[1], critic[1], categorical


def _on_policy_mlp(model) -> tuple[list[torch.nn.Module], tuple, tuple, bool] | None:
    """For an on-policy MLP policy — SB3's ``ActorCriticPolicy`` on a 1-D Box, shared flatten extractor, no
    gSDE, Categorical or diagonal Gaussian actions: the modules whose calls a flat function skips, the
    actor's and the critic's layer sequences, and whether the actions are categorical; None elsewhere."""
    from stable_baselines3.common.distributions import CategoricalDistribution, DiagGaussianDistribution
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor

    policy = model.policy
    distribution = type(getattr(policy, "action_dist", None))
    if not isinstance(model, OnPolicyAlgorithm) or type(policy) is not ActorCriticPolicy or model.use_sde \
            or not policy.share_features_extractor or type(policy.features_extractor) is not FlattenExtractor \
            or type(policy.mlp_extractor) is not MlpExtractor \
            or distribution not in (CategoricalDistribution, DiagGaussianDistribution) \
            or not isinstance(policy.observation_space, spaces.Box) or len(policy.observation_space.shape) != 1:
        return None
    extractor, mlp = policy.features_extractor, policy.mlp_extractor
    return ([policy, extractor, extractor.flatten, mlp], (mlp.policy_net, policy.action_net),
            (mlp.value_net, policy.value_net), distribution is CategoricalDistribution)
