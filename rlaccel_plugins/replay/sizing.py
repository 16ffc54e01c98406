"""Tier sizes for a framework buffer of a given size: which settings win, and scaling to a capacity."""

from __future__ import annotations

import dataclasses
import logging

from rlaccel_plugins.config import ReplayBufferConfig
from rlaccel_plugins.errors import invalid

logger = logging.getLogger("rlaccel")


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


def fit_tiers(replay: ReplayBufferConfig, capacity: int, num_envs: int = 1) -> ReplayBufferConfig:
    """A preset's tiers inside a buffer of ``capacity`` transitions (the user's size, never changed).

    The recent levels are recency windows: they keep their sizes and ratios. The last (long-term)
    level takes whatever the capacity leaves, larger or smaller. When the capacity cannot hold the
    recent levels, levels are cut from the long-term end (the last level kept takes the cut levels'
    ratios) and one log line says so. Capacities count transitions; with ``num_envs`` streams each
    level holds whole rows, and the buffer ``capacity // num_envs`` rows.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> atari = rla.get_preset("atari").replay_buffer
        >>> fit_tiers(atari, 1_000_000).level_capacity
        (1000, 5000, 20000, 974000)
        >>> small = fit_tiers(atari, 10_000)
        >>> small.level_capacity, small.sampling_ratio
        ((1000, 5000, 4000), (0.7, 0.2, 0.1))
    """
    rows = int(capacity) // num_envs
    if rows < 1:
        raise invalid("buffer_size", f"hold at least one transition per env (num_envs={num_envs})", capacity)
    recent = [c // num_envs for c in replay.level_capacity[:-1]]
    keep = len(replay.level_capacity)
    while keep > 1 and sum(recent[:keep - 1]) >= rows:
        keep -= 1
    level_rows = [*recent[:keep - 1], rows - sum(recent[:keep - 1])]
    ratios = [*replay.sampling_ratio[:keep - 1], sum(replay.sampling_ratio[keep - 1:])]
    fitted = dataclasses.replace(replay, levels=keep, level_capacity=tuple(r * num_envs for r in level_rows),
                                 sampling_ratio=tuple(ratios))
    if keep < replay.levels:
        logger.info("rlaccel: a buffer of %d transitions cannot hold the recent levels %s: kept levels %s, "
                    "ratios %s (pass level_capacity to choose the tiers yourself)", capacity,
                    list(replay.level_capacity[:-1]), list(fitted.level_capacity),
                    [round(r, 6) for r in fitted.sampling_ratio])
    return fitted


def tiers_for_capacity(replay: ReplayBufferConfig, capacity: int, num_envs: int = 1, *,
                       preset: str | None = None) -> ReplayBufferConfig:
    """``replay``'s tiers in a buffer of ``capacity`` transitions: a named ``preset``'s are fitted
    (:func:`fit_tiers`); the default's (no preset, or ``default``: one meaning) keep their proportions,
    scaled (:func:`scale_tiers`). Which preset is in effect is the loader's answer
    (:func:`rlaccel_plugins.loader.resolve_replay_config`)."""
    if preset not in (None, "default"):
        return fit_tiers(replay, capacity, num_envs)
    return scale_tiers(replay, capacity, num_envs)
