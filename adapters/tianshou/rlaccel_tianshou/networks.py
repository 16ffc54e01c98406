"""Tianshou networks for the task families rlaccel ships one for (:mod:`rlaccel_plugins.networks`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlaccel_plugins.networks import MINATAR_FEATURES, channels_first, minatar_torso


class MinAtarQNetwork(torch.nn.Module):
    """The MinAtar paper's Q-network for Tianshou's ``DiscreteQLearningPolicy``: a 3x3 convolution of 16
    channels, a 128-unit layer and a linear layer to the actions, on ``(10, 10, channels)`` observations.

    Examples:
        >>> import numpy as np
        >>> net = MinAtarQNetwork(observation_shape=(10, 10, 4), n_actions=3)
        >>> q, state = net(np.zeros((2, 10, 10, 4), dtype=bool))
        >>> q.shape
        torch.Size([2, 3])
    """

    def __init__(self, observation_shape: tuple[int, ...], n_actions: int) -> None:
        super().__init__()
        side, _, channels = observation_shape
        self.torso = minatar_torso(channels, side)
        self.head = torch.nn.Linear(MINATAR_FEATURES, n_actions)

    def forward(self, obs: Any, state: Any = None, info: Any = None) -> tuple[torch.Tensor, Any]:
        device = self.head.weight.device
        obs = torch.as_tensor(np.asarray(obs) if not torch.is_tensor(obs) else obs, device=device)
        return self.head(self.torso(channels_first(obs))), state
