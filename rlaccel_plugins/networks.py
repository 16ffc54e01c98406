"""Networks rlaccel ships for task families whose published recipes name one, written once for both adapters.

:func:`minatar_torso` is the network of the MinAtar paper (Young & Tian 2019, "MinAtar: An Atari-Inspired
Testbed for Thorough and Reproducible Reinforcement Learning Experiments"): one 3x3 convolution of 16
channels, stride 1, a ReLU, then a fully connected layer of 128 units and a ReLU, on 10x10 boolean
images with a channel per kind of object. The adapters put the action head on it: SB3's
:class:`rlaccel_sb3.MinAtarCNN` (a features extractor, the head from ``net_arch=[]``) and Tianshou's
:class:`rlaccel_tianshou.MinAtarQNetwork`.

Examples:
    >>> import torch
    >>> torso = minatar_torso(in_channels=4)
    >>> torso(torch.zeros(2, 4, 10, 10)).shape  # channels first
    torch.Size([2, 128])
"""

from __future__ import annotations

import torch

MINATAR_SIDE = 10  # MinAtar's images are 10x10
MINATAR_FEATURES = 128


def minatar_torso(in_channels: int, side: int = MINATAR_SIDE) -> torch.nn.Sequential:
    """The MinAtar paper's network up to its last hidden layer, on ``(batch, in_channels, side, side)``
    float inputs (channels first)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(in_channels, 16, kernel_size=3, stride=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(16 * (side - 2) ** 2, MINATAR_FEATURES), torch.nn.ReLU())


def channels_first(observations: torch.Tensor) -> torch.Tensor:
    """MinAtar's ``(batch, side, side, channels)`` observations as float ``(batch, channels, side, side)``."""
    return observations.float().permute(0, 3, 1, 2)
