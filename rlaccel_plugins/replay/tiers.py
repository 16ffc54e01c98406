"""`TierLayout`: levels as age ranges of one ring, and the stratified batch split across them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlaccel_plugins.errors import ConfigError, invalid


class TierLayout:
    """Levels L0..L{n-1} as consecutive age ranges (0 = newest) of one ring per env stream.

    With ``num_envs`` streams in lock-step, level ``i`` holds the newest ``level_capacity[i] //
    num_envs`` rows after the levels before it; a row holds one transition per env. Promotion
    L0 -> L1 -> ... is aging: nothing moves.

    Examples:
        >>> layout = TierLayout([4, 8], num_envs=2)
        >>> layout.rows_per_level.tolist(), layout.total_rows
        ([2, 4], 6)
        >>> layout.filled_rows(3).tolist()          # 3 rows written: L0 full, L1 holds 1
        [2, 1]
    """

    def __init__(self, level_capacity: Sequence[int], num_envs: int = 1) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise invalid("num_envs", "be a positive integer", num_envs)
        caps = np.asarray(level_capacity, dtype=np.int64)
        if caps.ndim != 1 or caps.size == 0 or (caps < 1).any():
            raise invalid("level_capacity", "be a non-empty list of positive integers", list(level_capacity))
        if (caps < num_envs).any():
            raise ConfigError(
                f"level_capacity must give every level at least one row per env (>= num_envs={num_envs}), "
                f"got level_capacity={caps.tolist()}. Raise the small levels to >= {num_envs} or use fewer envs.")
        self.num_envs = int(num_envs)
        self.level_capacity = caps
        self.rows_per_level = caps // num_envs
        self.level_start = np.concatenate([[0], np.cumsum(self.rows_per_level)[:-1]])
        self.total_rows = int(self.rows_per_level.sum())

    @property
    def num_levels(self) -> int:
        return int(self.rows_per_level.size)

    @property
    def capacity(self) -> int:
        """Transitions the ring holds (``total_rows * num_envs``; may round each level down)."""
        return self.total_rows * self.num_envs

    def filled_rows(self, stored_rows: int | np.ndarray) -> np.ndarray:
        """Rows of each level that hold data when ``stored_rows`` rows (newest first) are stored.

        An array of per-stream row counts gives one row of level fills per stream.
        """
        return np.clip(np.asarray(stored_rows)[..., None] - self.level_start, 0, self.rows_per_level)

    def level_of_age(self, ages: np.ndarray) -> np.ndarray:
        """Level id of each row age (0 = newest row)."""
        return np.searchsorted(self.level_start, ages, side="right") - 1


def stratified_counts(batch_size: int, probs: np.ndarray) -> np.ndarray:
    """Split ``batch_size`` by ``probs``: floor of the expected counts, remainders by largest fraction.

    Ties go to the lower level. ``probs`` must sum to 1 over the levels that may be drawn.

    Examples:
        >>> stratified_counts(10, np.array([0.7, 0.2, 0.08, 0.02])).tolist()
        [7, 2, 1, 0]
    """
    expected = batch_size * probs
    counts = np.floor(expected).astype(np.int64)
    remainder = batch_size - int(counts.sum())
    if remainder > 0:
        # rounded so that float noise (512 * 0.7 = 358.39999...) cannot break a tie
        order = np.argsort(-np.round(expected - counts, 9), kind="stable")
        counts[order[:remainder]] += 1
    return counts
