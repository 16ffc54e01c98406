"""Which (network, optimizer) pairs an SB3 model trains, and a batch to trace each with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.preprocessing import get_action_dim

from rlaccel_plugins.errors import ConfigError


@dataclass
class TrainedNetwork:
    """One network and the optimizer that trains it, with the arguments of one traced forward."""

    name: str
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    example_input: Any


def zero_observations(space: spaces.Space, batch: int) -> Any:
    """A batch of zero observations (numpy, like an env returns them); no RNG is touched."""
    if isinstance(space, spaces.Dict):
        return {k: zero_observations(s, batch) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Discrete):
        return np.zeros(batch, dtype=np.int64)
    return np.zeros((batch, *space.shape), dtype=space.dtype)


def trained_networks(model: BaseAlgorithm, batch: int = 8) -> list[TrainedNetwork]:
    """The pairs to put under the sparse/dense schedule (SAC's entropy optimizer is left out).

    DQN: ``q_net``; QR-DQN: ``quantile_net``; SAC, TD3, DDPG, TQC, CrossQ: ``actor`` and ``critic``;
    PPO, A2C and other actor-critic policies: the whole ``policy`` with its one optimizer.
    """
    policy = model.policy
    obs, _ = policy.obs_to_tensor(zero_observations(model.observation_space, batch))
    args = (obs,)  # a tuple: the updater would unpack a dict observation as keyword arguments
    for name in ("q_net", "quantile_net"):
        if isinstance(getattr(policy, name, None), torch.nn.Module) and hasattr(policy, "optimizer"):
            return [TrainedNetwork(name, getattr(policy, name), policy.optimizer, args)]
    actor, critic = getattr(policy, "actor", None), getattr(policy, "critic", None)
    if actor is not None and critic is not None and hasattr(actor, "optimizer") and hasattr(critic, "optimizer"):
        actions = torch.zeros(batch, get_action_dim(model.action_space), device=policy.device)
        return [TrainedNetwork("actor", actor, actor.optimizer, args),
                TrainedNetwork("critic", critic, critic.optimizer, (obs, actions))]
    if hasattr(policy, "optimizer"):
        return [TrainedNetwork("policy", policy, policy.optimizer, args)]
    raise ConfigError(f"model must train its policy with torch optimizers, got {type(model).__name__} whose policy "
                    f"{type(policy).__name__} has none. Use the tiered buffer without the sparse/dense callback.")


def critic_networks(model: BaseAlgorithm) -> list[torch.nn.Module]:
    """Networks whose outputs a per-sample TD loss is taken on (where importance weights apply)."""
    policy = model.policy
    for name in ("q_net", "quantile_net", "critic"):
        if isinstance(getattr(policy, name, None), torch.nn.Module):
            return [getattr(policy, name)]
    return []


def frame_input_networks(policy: torch.nn.Module) -> list[torch.nn.Module]:
    """The networks under ``policy`` that take observations and run only SB3's own ``NatureCNN`` on
    them (``QNetwork``, ``Actor``, ``ContinuousCritic``, ``ActorCriticPolicy``...): between their input and
    the first convolution there is only ``preprocess_obs``'s elementwise ``float()`` and ``/ 255``, so
    ``training.channels_last`` can convert their uint8 frames (:class:`ChannelsLast`'s ``frame_inputs``).
    A custom extractor is left to its convolutions' own conversion."""
    from stable_baselines3.common.policies import BaseModel
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, NatureCNN

    networks = []
    for module in policy.modules():
        extractors = [c for c in module.children() if isinstance(c, BaseFeaturesExtractor)]
        if isinstance(module, BaseModel) and extractors and all(type(c) is NatureCNN for c in extractors):
            networks.append(module)
    return networks
