"""Tier sizes for a framework buffer of a given size: which settings win, and scaling to a capacity."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from rlaccel_plugins.config import ReplayBufferConfig, load_config


def scale_tiers(replay: ReplayBufferConfig, capacity: int, num_envs: int = 1) -> ReplayBufferConfig:
    """The same tier proportions and ratios, resized to hold ``capacity`` transitions.

    Every level keeps at least one row per env; a capacity too small for that becomes one
    uniform level.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> scale_tiers(rla.get_preset("atari").replay_buffer, 252_000).level_capacity
        (2000, 10000, 40000, 200000)
    """
    capacity = max(int(capacity), num_envs)
    if capacity < replay.levels * num_envs:
        return dataclasses.replace(replay, levels=1, level_capacity=(capacity,), sampling_ratio=(1.0,))
    total = replay.capacity
    caps = [max(num_envs, round(c * capacity / total)) for c in replay.level_capacity]
    caps[-1] = max(num_envs, caps[-1] + capacity - sum(caps))  # the long-term level absorbs rounding
    return dataclasses.replace(replay, level_capacity=tuple(caps))


def resolve_replay_config(capacity: int, num_envs: int = 1, preset: str | None = None,
                          **overrides: Any) -> ReplayBufferConfig:
    """The tiers a framework buffer of ``capacity`` transitions gets.

    ``level_capacity`` in ``overrides`` wins; else a named preset (the ``preset`` argument or
    ``RLACCEL_PRESET``) gives its tiers as they are; else the default proportions are scaled to
    ``capacity`` (the framework's ``buffer_size``). Other overrides (ratios, schedule, beta) apply on top.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    config = load_config(preset=preset, **given).replay_buffer
    if "level_capacity" in given or preset is not None or os.environ.get("RLACCEL_PRESET"):
        return config
    return scale_tiers(config, capacity, num_envs)
