"""`TieredSampler`: which (row, env) pairs a batch reads, their levels and importance weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlaccel_plugins.replay.tiers import TierLayout, stratified_counts


@dataclass
class SampledIndices:
    """Where a batch lies in the ring: physical ``rows``, ``envs``, ``levels`` and ``weights``."""

    rows: np.ndarray
    envs: np.ndarray
    levels: np.ndarray
    weights: np.ndarray | None


class TieredSampler:
    """Draws a stratified batch over the filled levels of a :class:`TierLayout`.

    The batch is split across the levels that hold data by their ratios renormalised over those
    levels, then drawn uniformly inside each level's filled age range (rows) and across env
    streams, and shuffled (so a caller slicing the batch into minibatches gets every level in each).
    With ``ratio_schedule="anneal"`` the ratios move linearly toward size-proportional (uniform over
    all stored transitions) as ``progress`` goes from 0 to 1.

    Args:
        layout: the tiers.
        sampling_ratio: one ratio per level, summing to 1.
        ratio_schedule: ``"constant"`` or ``"anneal"``.
        importance_beta: ``None`` for no weights, else the exponent of ``(N*P)^-beta / max``.
        seed: seed of this sampler's own RNG (``numpy.random.Generator``).
    """

    def __init__(self, layout: TierLayout, sampling_ratio, ratio_schedule: str = "constant",
                 importance_beta: float | None = None, seed: int | None = None) -> None:
        self.layout = layout
        self.sampling_ratio = np.asarray(sampling_ratio, dtype=np.float64)
        self.ratio_schedule = ratio_schedule
        self.importance_beta = importance_beta
        self.rng = np.random.default_rng(seed)
        self.level_samples = np.zeros(layout.num_levels, dtype=np.int64)
        self._plan_key: tuple | None = None
        self._plan_value: tuple = ()
        self._counts = np.zeros(layout.num_levels, dtype=np.int64)

    def level_probabilities(self, stored_rows: int, progress: float = 0.0) -> np.ndarray:
        """Share of a batch each level gets now (zero for empty levels; sums to 1)."""
        filled = self.layout.filled_rows(stored_rows)
        ratios = np.where(filled > 0, self.sampling_ratio, 0.0)
        total = ratios.sum()
        if total <= 0:  # every filled level has ratio 0: fall back to size-proportional
            ratios, total = filled.astype(np.float64), float(filled.sum())
        ratios = ratios / total
        if self.ratio_schedule == "anneal" and progress > 0:
            f = min(1.0, progress)
            ratios = (1.0 - f) * ratios + f * filled / filled.sum()
        return ratios

    def draw(self, batch_size: int, stored_rows: int, pos: int, progress: float = 0.0) -> SampledIndices:
        """Sample ``batch_size`` (row, env) pairs from a ring whose next write row is ``pos``."""
        layout = self.layout
        filled, probs, levels_sorted, base, width = self._plan(batch_size, stored_rows, progress)
        self.level_samples += self._counts
        order = self.rng.permutation(batch_size)
        levels = levels_sorted[order]
        ages = base[order] + (self.rng.random(batch_size) * width[order]).astype(np.int64)
        rows = (pos - 1 - ages) % layout.total_rows
        envs = self.rng.integers(0, layout.num_envs, size=batch_size) if layout.num_envs > 1 \
            else np.zeros(batch_size, dtype=np.int64)
        weights = self._weights(levels, probs, filled) if self.importance_beta is not None else None
        return SampledIndices(rows=rows, envs=envs, levels=levels, weights=weights)

    def draw_streams(self, batch_size: int, stored_rows: np.ndarray, pos: np.ndarray,
                     progress: float = 0.0) -> SampledIndices:
        """Like :meth:`draw` for env streams that are *not* in lock-step (each its own ring).

        ``stored_rows[s]`` and ``pos[s]`` describe stream ``s``. Levels are split over all streams'
        data together; inside a level, every stored transition of every stream is equally likely.
        """
        layout = self.layout
        stored_rows, pos = np.asarray(stored_rows), np.asarray(pos)
        per_stream = layout.filled_rows(stored_rows)
        filled = per_stream.sum(axis=0)  # rows of each level over all streams
        ratios = np.where(filled > 0, self.sampling_ratio, 0.0)
        probs = ratios / ratios.sum() if ratios.sum() > 0 else filled / filled.sum()
        if self.ratio_schedule == "anneal" and progress > 0:
            f = min(1.0, progress)
            probs = (1.0 - f) * probs + f * filled / filled.sum()
        counts = stratified_counts(batch_size, probs)
        self.level_samples += counts
        levels = self.rng.permutation(np.repeat(np.arange(layout.num_levels), counts))
        streams = np.empty(batch_size, dtype=np.int64)
        for level in np.flatnonzero(counts):
            at = levels == level
            share = per_stream[:, level] / filled[level]
            streams[at] = self.rng.choice(len(stored_rows), size=int(counts[level]), p=share)
        width = per_stream[streams, levels]
        ages = layout.level_start[levels] + (self.rng.random(batch_size) * width).astype(np.int64)
        rows = (pos[streams] - 1 - ages) % layout.total_rows
        weights = self._weights(levels, probs, filled) if self.importance_beta is not None else None
        return SampledIndices(rows=rows, envs=streams, levels=levels, weights=weights)

    def _plan(self, batch_size: int, stored_rows: int, progress: float):
        # the split only changes with the fill (and the anneal progress): cache it, since a full
        # buffer with a constant schedule samples with the same plan forever
        key = (batch_size, stored_rows, progress if self.ratio_schedule == "anneal" else 0.0)
        if key != self._plan_key:
            filled = self.layout.filled_rows(stored_rows)
            probs = self.level_probabilities(stored_rows, progress)
            self._counts = stratified_counts(batch_size, probs)
            levels_sorted = np.repeat(np.arange(self.layout.num_levels), self._counts)
            self._plan_value = (filled, probs, levels_sorted, self.layout.level_start[levels_sorted],
                                filled[levels_sorted])
            self._plan_key = key
        return self._plan_value

    def _weights(self, levels: np.ndarray, probs: np.ndarray, filled: np.ndarray) -> np.ndarray:
        # P(a given transition of level i) = p_i / n_i; w = (N*P)^-beta, divided by the largest
        # weight any stored transition can get, so weights are in (0, 1] and comparable across batches.
        stored = filled * self.layout.num_envs
        drawable = (probs > 0) & (stored > 0)
        per_level = np.zeros_like(probs)
        beta = float(self.importance_beta or 0.0)  # only called with weights on
        per_level[drawable] = (stored.sum() * probs[drawable] / stored[drawable]) ** -beta
        return (per_level[levels] / per_level[drawable].max()).astype(np.float32)

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "level_samples": self.level_samples.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.level_samples[:] = state["level_samples"]


def seed_from_numpy_global_state() -> int:
    """A seed derived from numpy's global RNG state, without drawing from it.

    For buffers a framework builds after seeding numpy's global RNG but without passing a seed
    (SB3's ``set_random_seed``): the same global state gives the same seed, and the global stream,
    which the framework's exploration draws from, is left exactly as it was.

    Examples:
        >>> np.random.seed(0); a = seed_from_numpy_global_state(); x = np.random.rand()
        >>> np.random.seed(0); b = seed_from_numpy_global_state(); y = np.random.rand()
        >>> a == b and x == y
        True
    """
    _, keys, position, *_ = np.random.get_state(legacy=True)  # type: ignore[misc]  # the legacy tuple
    return int(np.random.SeedSequence([*np.asarray(keys).tolist(), int(position)]).generate_state(1, np.uint64)[0])
