"""Sampling schemes other than the tiers' ratios: uniform, ERE and CER, and :func:`make_sampler`.

Each draws over the same ring as :class:`~rlaccel_plugins.replay.sampler.TieredSampler` and answers
the same calls (``draw`` for env streams in lock-step, ``draw_streams`` for streams that are not),
so the engine and both adapters take any of them. The levels stay what they are (age ranges): a
scheme only decides which ages a batch reads, and each sampled row still reports its level.

- ``uniform``: every stored transition alike, the frameworks' own replay distribution.
- ``ere`` (Wang & Ross 2019, "Boosting Soft Actor-Critic: Emphasizing Recent Experience without
  Forgetting the Past"): the k-th of K updates draws uniformly from the newest
  ``c_k = max(N * eta ** (k * 1000 / K), c_min)`` transitions, N the number stored, k = 1..K, with
  ``eta`` annealed linearly to 1 over training. The paper runs its K updates after each episode of
  K steps; here a sweep is K consecutive batches, whenever they are drawn, so an agent that updates
  every env step (SB3's SAC) or in bursts (SB3's DQN) gets the same mixture of windows.
- ``cer`` (Zhang & Sutton 2017, "A Deeper Look at Experience Replay"): the newest transition of each
  env stream is always in the batch, the rest uniform.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from rlaccel_plugins.config import ReplayBufferConfig
from rlaccel_plugins.errors import invalid
from rlaccel_plugins.replay.sampler import SampledIndices, TieredSampler
from rlaccel_plugins.replay.tiers import TierLayout


class Sampler(Protocol):
    """What every sampling scheme is: the contract the engine and both adapters' buffers rely on.

    It draws over one ring of ``layout.total_rows`` rows per env stream, newest at ``pos - 1``; it owns its
    random stream (``rng``, a NumPy ``Generator``: nothing else draws from it) and counts the rows it drew
    per level (``level_samples``, the buffers' ``level_samples/L<i>`` metric). Its whole state for a
    checkpoint is ``state_dict()``. ``progress`` (added transitions / ``anneal_steps``) drives schedules.
    """

    layout: TierLayout
    rng: np.random.Generator
    level_samples: np.ndarray

    def draw(self, batch_size: int, stored_rows: int, pos: int, progress: float = 0.0) -> SampledIndices:
        """``batch_size`` (row, env) pairs from streams in lock-step (``stored_rows`` filled, next write ``pos``)."""
        ...

    def draw_streams(self, batch_size: int, stored_rows: np.ndarray, pos: np.ndarray,
                     progress: float = 0.0) -> SampledIndices:
        """The same for streams that are not in lock-step (per-stream fill and write position)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class WindowSampler:
    """Uniform draws over the newest ``window`` transitions (all of them by default).

    Args:
        layout: the ring's levels (reported per sampled row; they do not weigh the draw).
        seed: seed of this sampler's own RNG.

    Examples:
        >>> sampler = WindowSampler(TierLayout([10, 90]), seed=0)
        >>> drawn = sampler.draw(1000, stored_rows=100, pos=0)
        >>> int(drawn.rows.min()), int(drawn.rows.max()), sampler.level_samples.tolist()  # ~1:9, as stored
        (0, 99, [89, 911])
    """

    def __init__(self, layout: TierLayout, seed: int | None = None) -> None:
        self.layout = layout
        self.rng = np.random.default_rng(seed)
        self.level_samples = np.zeros(layout.num_levels, dtype=np.int64)

    def window(self, stored: int, progress: float) -> int:
        """How many of the ``stored`` newest transitions the next batch draws from."""
        return stored

    def newest_first(self, batch_size: int, streams: int) -> int:
        """How many rows of a batch are the newest transition of each stream (CER's; none here)."""
        return 0

    def draw(self, batch_size: int, stored_rows: int, pos: int, progress: float = 0.0) -> SampledIndices:
        """Sample ``batch_size`` (row, env) pairs from a lock-step ring whose next write row is ``pos``."""
        layout = self.layout
        width = min(stored_rows, max(1, math.ceil(self.window(stored_rows * layout.num_envs, progress) /
                                                  layout.num_envs)))
        ages = (self.rng.random(batch_size) * width).astype(np.int64)
        envs = self.rng.integers(0, layout.num_envs, size=batch_size) if layout.num_envs > 1 \
            else np.zeros(batch_size, dtype=np.int64)
        newest = self.newest_first(batch_size, layout.num_envs)
        ages[:newest], envs[:newest] = 0, np.arange(newest)
        return self._indices((pos - 1 - ages) % layout.total_rows, envs, ages)

    def draw_streams(self, batch_size: int, stored_rows: np.ndarray, pos: np.ndarray,
                     progress: float = 0.0) -> SampledIndices:
        """Like :meth:`draw` for streams that are not in lock-step: the window is the same share of each
        stream's data, and inside it every transition of every stream is equally likely."""
        stored_rows, pos = np.asarray(stored_rows, dtype=np.int64), np.asarray(pos, dtype=np.int64)
        total = int(stored_rows.sum())
        share = self.window(total, progress) / total
        widths = np.minimum(stored_rows, np.maximum(np.ceil(stored_rows * share), 1).astype(np.int64))
        widths[stored_rows == 0] = 0
        streams = self.rng.choice(len(stored_rows), size=batch_size, p=widths / widths.sum())
        ages = (self.rng.random(batch_size) * widths[streams]).astype(np.int64)
        filled = np.flatnonzero(stored_rows)
        newest = self.newest_first(batch_size, len(filled))
        ages[:newest], streams[:newest] = 0, filled[:newest]
        return self._indices((pos[streams] - 1 - ages) % self.layout.total_rows, streams, ages)

    def _indices(self, rows: np.ndarray, envs: np.ndarray, ages: np.ndarray) -> SampledIndices:
        levels = self.layout.level_of_age(ages)
        self.level_samples += np.bincount(levels, minlength=self.layout.num_levels)
        return SampledIndices(rows=rows, envs=envs, levels=levels, weights=None)

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "level_samples": self.level_samples.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.level_samples[:] = state["level_samples"]


class UniformSampler(WindowSampler):
    """Every stored transition alike (``sampling: uniform``): the frameworks' own replay distribution."""


class CerSampler(WindowSampler):
    """Combined experience replay (``sampling: cer``): the newest transition of each env stream in every
    batch (up to the batch size), the rest uniform over everything stored.

    Examples:
        >>> sampler = CerSampler(TierLayout([8, 8], num_envs=2), seed=0)
        >>> drawn = sampler.draw(4, stored_rows=8, pos=3)
        >>> drawn.rows[:2].tolist(), drawn.envs[:2].tolist()   # row 2 is the newest, for both envs
        ([2, 2], [0, 1])
    """

    def newest_first(self, batch_size: int, streams: int) -> int:
        return min(batch_size, streams)


class EreSampler(WindowSampler):
    """Emphasizing recent experience (``sampling: ere``): batch k of every K draws from the newest
    ``max(N * eta_t ** (k * 1000 / K), c_min)`` transitions, ``eta_t`` going linearly from ``eta`` to 1
    as ``progress`` (added transitions / ``anneal_steps``) goes from 0 to 1.

    Args:
        layout: the ring's levels.
        eta: the recency base (the paper's 0.996).
        c_min: the smallest window (the paper's 5000).
        updates: K, batches per sweep (the paper's 1000, one MuJoCo episode).
        seed: seed of the sampler's own RNG.

    Examples:
        >>> sampler = EreSampler(TierLayout([100_000]), eta=0.996, c_min=5000, updates=1000)
        >>> [sampler.window_at(k, 100_000, 0.0) for k in (1, 500, 1000)]   # the paper's sweep
        [99600, 13479, 5000]
        >>> sampler.window_at(1000, 100_000, 1.0)                          # eta annealed to 1: uniform
        100000
    """

    def __init__(self, layout: TierLayout, eta: float = 0.996, c_min: int = 5000, updates: int = 1000,
                 seed: int | None = None) -> None:
        super().__init__(layout, seed)
        self.eta, self.c_min, self.updates = float(eta), int(c_min), int(updates)
        self.drawn = 0  # batches drawn since creation: the position in the sweep

    def window_at(self, k: int, stored: int, progress: float) -> int:
        """``c_k`` for batch ``k`` (1..K) of a sweep when ``stored`` transitions are held."""
        eta = self.eta + (1.0 - self.eta) * min(max(progress, 0.0), 1.0)
        return min(stored, max(int(stored * eta ** (k * 1000 / self.updates)), self.c_min))

    def window(self, stored: int, progress: float) -> int:
        k = self.drawn % self.updates + 1
        self.drawn += 1
        return self.window_at(k, stored, progress)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.drawn = int(state.get("drawn", 0))


# each scheme of the config's list (config.SCHEME_SETTINGS: its name and the settings it reads) built from the
# replay config; ``auto`` is resolved per algorithm family before this (replay.evidence.resolve_sampling)
SCHEMES: dict[str, Callable[[TierLayout, ReplayBufferConfig, int | None], Sampler]] = {
    "uniform": lambda layout, r, seed: UniformSampler(layout, seed),
    "tiers": lambda layout, r, seed: TieredSampler(layout, r.sampling_ratio, r.ratio_schedule, r.importance_beta, seed),
    "ere": lambda layout, r, seed: EreSampler(layout, r.ere_eta, r.ere_c_min, r.ere_updates, seed),
    "cer": lambda layout, r, seed: CerSampler(layout, seed),
}


def make_sampler(layout: TierLayout, replay: ReplayBufferConfig, seed: int | None = None) -> Sampler:
    """The sampler ``replay.sampling`` names (:data:`SCHEMES`), over ``layout``.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> replay = rla.load_config(sampling="cer").replay_buffer
        >>> type(make_sampler(TierLayout(replay.level_capacity), replay)).__name__
        'CerSampler'
    """
    if replay.sampling not in SCHEMES:  # ``auto``: the caller knows the algorithm family (replay.evidence)
        raise invalid("sampling", f"be one of {list(SCHEMES)} here", replay.sampling,
                      "Resolve auto first: rlaccel_plugins.replay.evidence.resolve_sampling(replay, framework, algo).")
    return SCHEMES[replay.sampling](layout, replay, seed)
