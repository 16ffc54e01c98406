"""Tianshou's networks as flat functions — the same tensor ops, without module calls — for the fused
updates and the lean collection: ``Net``, ``MLP``, ``ContinuousCritic``, the continuous actors and
``DiscreteActor`` / ``DiscreteCritic`` of Linear/ReLU/Tanh layers, where no forward hook is registered
(else the modules themselves). What is built from a network is kept until its module tree changes, and
checked once per phase of an update (:func:`next_epoch`)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from rlaccel_plugins.fused.flat import apply_layers, flat_layers, layer_spec
from rlaccel_plugins.fused.module_cache import cached, new_epoch
from rlaccel_plugins.fused.module_cache import parameters as module_parameters

# the phase of the update in progress (its target side, then its training step under the wrapper's
# autocast): within one, what is built from a network is checked against the network once
_epoch: int | None = None


def next_epoch() -> None:
    """A new phase of an update: what is built from a network is checked against it again, once."""
    global _epoch
    _epoch = new_epoch()


def end_epoch() -> None:
    """The update is over: outside one, every use checks its network."""
    global _epoch
    _epoch = None


_FIRST_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def first_parameter(module: torch.nn.Module) -> torch.Tensor:
    """``next(module.parameters())``, found once (listing the parameters walks every submodule); the
    parameter follows the module to any device (``Module.to`` moves its data)."""
    parameter = _FIRST_PARAMETERS.get(module)
    if parameter is None:
        parameter = _FIRST_PARAMETERS[module] = next(module.parameters())
    return parameter


def parameters_of(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return module_parameters(module, _epoch)


def lagged(network: torch.nn.Module, mode_free: bool) -> torch.nn.Module:
    """A lagged network's module: its wrapper switches it to eval mode first, unless that changes nothing."""
    return network.module if mode_free else network


def forward_of(module: torch.nn.Module) -> Callable:
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


def net_spec(net: torch.nn.Module, containers: tuple = ()) -> tuple[tuple[str, ...], list[torch.Tensor]] | None:
    """A ``Net`` whose ``forward`` is its MLP alone (one atom, no softmax, not dueling) as
    :func:`~rlaccel_plugins.fused.flat.layer_spec` data — its layer kinds and parameters, for a compiled
    step's :func:`~rlaccel_plugins.fused.flat.apply_layers` on the flattened observations; None otherwise
    (``containers``: the modules around it, whose hooks would run too)."""
    from tianshou.utils.net.common import Net

    if type(net) is not Net or net.use_dueling or net.num_atoms != 1 or net.softmax:
        return None
    return mlp_spec(net.model, [*containers, net])


def mlp_spec(mlp: torch.nn.Module, containers: list) -> tuple[tuple[str, ...], list[torch.Tensor]] | None:
    """A Tianshou ``MLP`` as :func:`~rlaccel_plugins.fused.flat.layer_spec` data (on 2-D inputs, where its
    ``flatten_input`` changes nothing), or None."""
    from tianshou.utils.net.common import MLP

    return layer_spec([*containers, mlp], mlp.model) if type(mlp) is MLP else None


def critic_spec(critic: torch.nn.Module) -> tuple[tuple[str, ...], list[torch.Tensor]] | None:
    """A ``ContinuousCritic`` that applies its ``Net`` to the observations and actions concatenated (its
    default) as one MLP's layer data on ``cat([obs, act], 1)``, or None."""
    from tianshou.utils.net.continuous import ContinuousCritic

    if type(critic) is not ContinuousCritic or critic.apply_preprocess_net_to_obs_only:
        return None
    preprocess, last = net_spec(critic.preprocess, (critic,)), mlp_spec(critic.last, [critic])
    if preprocess is None or last is None:
        return None
    return preprocess[0] + last[0], preprocess[1] + last[1]


def probabilistic_actor_spec(actor: torch.nn.Module) -> tuple[tuple, list[torch.Tensor]] | None:
    """A ``ContinuousActorProbabilistic`` as data: ``((preprocess kinds, mu kinds, sigma kinds or None for
    the free ``sigma_param``, bounded, max_action), params)`` — the preprocess's, mu's, then sigma's
    parameters (or ``sigma_param``), for :func:`probabilistic_actor_apply`; None where a part is not
    layer data."""
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic

    if type(actor) is not ContinuousActorProbabilistic:
        return None
    preprocess, mu = net_spec(actor.preprocess, (actor,)), mlp_spec(actor.mu, [actor])
    sigma = mlp_spec(actor.sigma, [actor]) if actor._c_sigma else ((), [actor.sigma_param])
    if preprocess is None or mu is None or sigma is None:
        return None
    kinds = (preprocess[0], mu[0], sigma[0] if actor._c_sigma else None, not actor._unbounded, float(actor.max_action))
    return kinds, preprocess[1] + mu[1] + sigma[1]


def probabilistic_actor_apply(kinds: tuple, params: list[torch.Tensor], obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_flat_probabilistic_actor`'s ``(mu, sigma)`` from :func:`probabilistic_actor_spec` data: the same ops."""
    from tianshou.utils.net.continuous import SIGMA_MAX, SIGMA_MIN

    preprocess_kinds, mu_kinds, sigma_kinds, bounded, max_action = kinds
    n_pre, n_mu = _linear_count(preprocess_kinds), _linear_count(mu_kinds)
    logits = apply_layers(preprocess_kinds, params[:n_pre], obs.flatten(1))
    mu = apply_layers(mu_kinds, params[n_pre:n_pre + n_mu], logits)
    if bounded:
        mu = max_action * torch.tanh(mu)
    if sigma_kinds is not None:
        sigma = torch.clamp(apply_layers(sigma_kinds, params[n_pre + n_mu:], logits), min=SIGMA_MIN, max=SIGMA_MAX).exp()
    else:
        shape = [1] * len(mu.shape)
        shape[1] = -1
        sigma = (params[-1].view(shape) + torch.zeros_like(mu)).exp()
    return mu, sigma


def _linear_count(kinds: tuple[str, ...]) -> int:
    return 2 * sum(kind == "linear" for kind in kinds)


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


def is_mode_free(*models: torch.nn.Module) -> bool:
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
