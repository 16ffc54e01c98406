"""What ``sampling: auto`` (the default) samples for each algorithm family: the learning study's decisions.

A family samples by the tiers' ratios only where the learning study showed them to help: screened on
seeds 0-9, then confirmed on fresh seeds with P(tiers > uniform)'s 95% CI above 0.5 (the decision table
in the docs, "Learning study"; ``rlaccel bench --suite learning`` recomputes it). Every other family
samples uniformly, as the frameworks do. Image observations are decided apart (the pixel study, SB3 DQN on
MinAtar: the tiers, screened and confirmed); every other family on images is unmeasured there, so uniform.
"""

from __future__ import annotations

import dataclasses

from rlaccel_plugins.config import ReplayBufferConfig

# (framework, algorithm): the families whose screen and confirmation both favoured the article's tiers, on vector
# observations and, decided apart (the pixel study, a row "... (images)"), on image observations
TIERED_FAMILIES = frozenset({("sb3", "dqn"), ("sb3", "qrdqn")})
TIERED_IMAGE_FAMILIES = frozenset({("sb3", "dqn")})


def default_sampling(framework: str | None, algo: str | None, pixels: bool = False) -> str:
    """``tiers`` for a family the evidence keeps them for, else ``uniform`` (unknown families included).

    Examples:
        >>> default_sampling("sb3", "qrdqn"), default_sampling("sb3", "sac"), default_sampling("sb3", "qrdqn", pixels=True)
        ('tiers', 'uniform', 'uniform')
    """
    return "tiers" if (framework, algo) in (TIERED_IMAGE_FAMILIES if pixels else TIERED_FAMILIES) else "uniform"


def resolve_sampling(replay: ReplayBufferConfig, framework: str | None = None, algo: str | None = None,
                     pixels: bool = False) -> ReplayBufferConfig:
    """``replay`` with ``sampling: auto`` replaced by :func:`default_sampling`'s answer; any other value as it is."""
    if replay.sampling != "auto":
        return replay
    return dataclasses.replace(replay, sampling=default_sampling(framework, algo, pixels))

