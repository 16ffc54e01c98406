"""SB3 features extractors for the networks rlaccel ships (:mod:`rlaccel_plugins.networks`)."""

from __future__ import annotations

import torch
from gymnasium import spaces
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

from rlaccel_plugins.networks import MINATAR_FEATURES, channels_first, minatar_torso


class MinAtarCNN(BaseFeaturesExtractor):
    """The MinAtar paper's network as a features extractor: a 3x3 convolution of 16 channels and a
    128-unit layer on MinAtar's ``(10, 10, channels)`` boolean observations. With ``net_arch=[]`` SB3's
    DQN puts one linear layer to the actions on it: the paper's whole Q-network.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> from rlaccel_plugins.tasks import register_minatar
        >>> register_minatar()
        >>> model = DQN("MlpPolicy", "MinAtar/Breakout-v1", buffer_size=1_000,
        ...             policy_kwargs=dict(features_extractor_class=MinAtarCNN, net_arch=[]))
        >>> [type(m).__name__ for m in model.q_net.modules()][-7:]  # the torso, then the head to 3 actions
        ['Conv2d', 'ReLU', 'Flatten', 'Linear', 'ReLU', 'Sequential', 'Linear']
    """

    def __init__(self, observation_space: spaces.Box, features_dim: int = MINATAR_FEATURES) -> None:
        super().__init__(observation_space, features_dim)
        side, _, channels = observation_space.shape
        self.torso = minatar_torso(channels, side)

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.torso(channels_first(observations))
