"""Tianshou buffers with tiered sampling: drop-in for `ReplayBuffer` and `VectorReplayBuffer`.

Tianshou keeps its own storage (so ``stack_num``, ``save_only_last_obs``, ``ignore_obs_next``,
n-step ``prev``/``next``, ``save_hdf5``/``load_hdf5`` all work as before); the core engine's
sampler chooses the indices. A pickle holds what is stored: the written rows of each stream that has
not wrapped, the rest rebuilt as Tianshou allocates it on load. Two Tianshou 2.0.1 defects are fixed here rather than inherited:
``hasnull()`` (called by the trainer on every training step) checks only what was written since
the previous call instead of materialising the whole buffer, and the vector buffer's sub-buffers
get independent random streams and stay linked to the shared storage after unpickling.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd
from tianshou.data import Batch, ReplayBuffer, ReplayBufferManager

from rlaccel_plugins.config import ReplayBufferConfig
from rlaccel_plugins.loader import resolve_replay_config
from rlaccel_plugins.replay import TierLayout
from rlaccel_plugins.replay.evidence import resolve_sampling
from rlaccel_plugins.replay.schemes import make_sampler
from rlaccel_tianshou.kernel_cache import cache_tianshou_kernels

cache_tianshou_kernels()  # before anything here compiles Tianshou's numba kernels

logger = logging.getLogger("rlaccel")


def _tier_settings(size: int, num_streams: int, preset: str | None, overrides: dict[str, Any],
                   replay: ReplayBufferConfig | None = None):
    """The replay config and per-stream tier layout for a buffer of ``size`` transitions.

    Each stream holds ``ceil(size / num_streams)`` transitions, as in Tianshou's ``VectorReplayBuffer``;
    only an explicit ``level_capacity`` changes that. A ready ``replay`` config (rlaccel's own
    buffers) is used as it is; otherwise the ambient configuration decides.
    """
    capacity = -(-int(size) // num_streams) * num_streams
    if replay is None:
        replay = resolve_replay_config(capacity, num_streams, preset, **overrides)
    replay = resolve_sampling(replay, "tianshou")  # auto: no Tianshou family kept the tiers (uniform)
    layout = TierLayout(replay.level_capacity, num_streams)
    if layout.capacity != capacity:
        logger.info("rlaccel: level_capacity=%s sets the buffer's capacity to %d transitions (size was %d)",
                    list(replay.level_capacity), layout.capacity, size)
    return replay, layout


class TieredSamplingMixin:
    """What both buffers share: tiered ``sample``, ``add`` bookkeeping, incremental ``hasnull``, stats.

    A subclass says where its streams are (:meth:`_stream_state`) and how a (stream, row) pair maps
    to a global index (:meth:`_global_index`).
    """

    def _init_tiered(self, replay, layout: TierLayout, seed: int) -> None:
        self.replay_config = replay
        self.sampler = make_sampler(layout, replay, seed=seed)
        self.anneal_steps = replay.anneal_steps
        self.added = 0
        self._unchecked: list[np.ndarray] = []
        self._check_everything = True  # the first hasnull (and the first after loading) checks it all

    def add(self, batch: Batch, buffer_ids: np.ndarray | list[int] | None = None):
        result = super().add(batch, buffer_ids)
        self.note_added(np.asarray(result[0]))
        return result

    def note_added(self, indices: np.ndarray) -> None:
        """Count rows written at ``indices`` (by ``add``, or by a collector writing the storage itself)."""
        self._unchecked.append(indices)
        self.added += len(indices)

    def sample_indices(self, batch_size: int | None) -> np.ndarray:
        sizes, positions = self._stream_state()
        if batch_size is None or batch_size <= 0 or sizes.sum() == 0 or (self.stack_num > 1 and self._sample_avail):
            return super().sample_indices(batch_size)  # Tianshou's meanings of None / 0 / <0, and sample_avail
        where = self.sampler.draw_streams(batch_size, sizes, positions, self.added / self.anneal_steps)
        self._last_weights = where.weights
        return self._global_index(where.envs, where.rows)

    def sample(self, batch_size: int | None) -> tuple[Batch, np.ndarray]:
        self._last_weights = None
        indices = self.sample_indices(batch_size)
        batch = self[indices]
        if self._last_weights is not None:
            batch.weight = self._last_weights
        return batch, indices

    def hasnull(self) -> bool:
        """Whether a NaN was written: all rows on the first call, then only rows added since."""
        if self._check_everything:
            self._check_everything, self._unchecked = False, []
            return super().hasnull() if len(self) else False
        if not self._unchecked:
            return False
        written = np.unique(np.concatenate(self._unchecked))
        self._unchecked = []
        found = _rows_hold_null(self._meta, written)
        return bool(self._meta[written].hasnull()) if found is None else found

    def stats(self) -> dict[str, float]:
        """``level_fill/L<i>`` and ``level_samples/L<i>``, as the core engine reports them."""
        layout, sizes = self.sampler.layout, self._stream_state()[0]
        per_stream = layout.filled_rows(sizes)
        fill = per_stream.sum(axis=0) / (layout.rows_per_level * len(sizes))
        out = {f"level_fill/L{i}": float(f) for i, f in enumerate(fill)}
        out.update({f"level_samples/L{i}": int(n) for i, n in enumerate(self.sampler.level_samples)})
        return out

    def __getstate__(self) -> dict[str, Any]:
        # pickled as it loads: the NaN bookkeeping restarts (a loaded buffer checks all its rows once); the
        # storage as what is stored: the rows written so far of each stream that has not wrapped yet
        state = {**self.__dict__, "_unchecked": [], "_check_everything": True}
        rows = self._written_rows()
        if rows is not None and self._meta.get_keys():
            state["_meta"] = _map_leaves(self._meta, lambda leaf: leaf[rows])
            state["_written"] = (rows, self.maxsize)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        written = state.pop("_written", None)
        if written is not None:
            rows, length = written
            state["_meta"] = _map_leaves(state["_meta"], lambda leaf: _spread(leaf, rows, length))
        super().__setstate__(state)

    def _written_rows(self) -> np.ndarray | None:
        """Storage rows that hold data (None: every row), from each stream's fill."""
        sizes, _ = self._stream_state()
        starts = self._stream_starts()
        if (sizes == self._stream_capacity()).all():
            return None
        return np.concatenate([start + np.arange(size) for start, size in zip(starts, sizes)]).astype(np.int64)


def _map_leaves(batch: Batch, fn) -> Batch:
    """A ``Batch`` with ``fn`` applied to every array leaf (nested batches kept as batches)."""
    out = Batch()
    for key, value in batch.items():
        out[key] = _map_leaves(value, fn) if isinstance(value, Batch) else fn(value)
    return out


def _spread(rows_data: np.ndarray, rows: np.ndarray, length: int) -> np.ndarray:
    """The whole storage array back from its written rows: the other rows as Tianshou allocates them
    (``None`` for object arrays, 0 otherwise)."""
    full = np.full((length, *rows_data.shape[1:]), None if rows_data.dtype == object else 0, dtype=rows_data.dtype)
    full[rows] = rows_data
    return full


def _rows_hold_null(batch: Batch, rows: np.ndarray) -> bool | None:
    """``batch[rows].hasnull()`` — ``pd.isnull`` of every leaf's rows, any true — read straight from the leaf
    arrays (Tianshou builds the indexed ``Batch``, then a ``Batch`` of masks, and its trainer and
    collector each ask once per step); None where a leaf is not an array."""
    for value in batch.values():
        if isinstance(value, Batch):
            found = _rows_hold_null(value, rows)
            if found is not False:
                return found
        elif isinstance(value, np.ndarray):
            # integer and boolean arrays hold no null (pd.isnull is all False for them)
            if value.dtype.kind not in "biu" and np.any(pd.isnull(value[rows])):
                return True
        else:
            return None
    return False


class TieredReplayBuffer(TieredSamplingMixin, ReplayBuffer):
    """Tianshou ``ReplayBuffer`` whose samples are split across age levels (L0 newest).

    Args:
        size: capacity when no tiers are given (the default proportions are scaled to it).
        stack_num: as Tianshou's (so are ``ignore_obs_next``, ``save_only_last_obs``, ``sample_avail``
            and ``random_seed``).
        preset: the preset whose tiers to fit into ``size`` (its recent levels as they are, the
            long-term level takes the rest).
        level_capacity: the tiers' capacities; explicit, it sets the capacity to its sum.
            ``sampling_ratio``, ``ratio_schedule``, ``anneal_steps`` and ``importance_beta`` are the
            other tier settings (configuration reference).
        sampling: how a batch is drawn: ``"uniform"``, ``"tiers"``, ``"ere"`` or ``"cer"``.
        replay_config: a ready ``ReplayBufferConfig`` used as it is (what ``rlaccel train`` passes);
            the ambient configuration and the tier arguments are then not read.

    With ``importance_beta`` each sampled batch carries ``batch.weight`` (used by Tianshou's
    MSE-based losses: DQN without Huber, DDPG/TD3/SAC critics).

    Examples:
        >>> from rlaccel_tianshou import TieredReplayBuffer
        >>> buf = TieredReplayBuffer(20_000, preset=None, level_capacity=[2000, 18000], sampling_ratio=[0.3, 0.7])
        >>> buf.maxsize
        20000
    """

    def __init__(self, size: int, stack_num: int = 1, ignore_obs_next: bool = False,
                 save_only_last_obs: bool = False, sample_avail: bool = False, random_seed: int = 42, *,
                 preset: str | None = None, level_capacity: list[int] | None = None,
                 sampling_ratio: list[float] | None = None, ratio_schedule: str | None = None,
                 anneal_steps: int | None = None, importance_beta: float | None = None,
                 replay_config: ReplayBufferConfig | None = None, sampling: str | None = None,
                 **kwargs: Any) -> None:
        replay, layout = _tier_settings(size, 1, preset, dict(
            level_capacity=level_capacity, levels=len(level_capacity) if level_capacity else None,
            sampling_ratio=sampling_ratio, ratio_schedule=ratio_schedule, anneal_steps=anneal_steps,
            importance_beta=importance_beta, sampling=sampling), replay_config)
        super().__init__(layout.total_rows, stack_num=stack_num, ignore_obs_next=ignore_obs_next,
                         save_only_last_obs=save_only_last_obs, sample_avail=sample_avail,
                         random_seed=random_seed, **kwargs)
        self._init_tiered(replay, layout, random_seed)

    def _stream_state(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array([self._size]), np.array([self._insertion_idx])

    def _stream_starts(self) -> np.ndarray:
        return np.zeros(1, dtype=np.int64)

    def _stream_capacity(self) -> np.ndarray:
        return np.array([self.maxsize])

    def _global_index(self, streams: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return rows


class TieredVectorReplayBuffer(TieredSamplingMixin, ReplayBufferManager):
    """Drop-in for Tianshou's ``VectorReplayBuffer(total_size, buffer_num, **kwargs)`` with tiered sampling.

    Levels are split over every sub-buffer's data together; inside a level each stored transition
    of any sub-buffer is equally likely, whether or not the envs step in lock-step. Tier settings
    as for :class:`TieredReplayBuffer` (capacities count transitions over all sub-buffers).

    Examples:
        >>> from rlaccel_tianshou import TieredVectorReplayBuffer
        >>> buf = TieredVectorReplayBuffer(20_000, 10, preset="classic_control")
        >>> buf.maxsize, buf.buffer_num, buf.sampler.layout.level_capacity.tolist()
        (20000, 10, [5000, 15000])
    """

    def __init__(self, total_size: int, buffer_num: int, *, preset: str | None = None,
                 level_capacity: list[int] | None = None, sampling_ratio: list[float] | None = None,
                 ratio_schedule: str | None = None, anneal_steps: int | None = None,
                 importance_beta: float | None = None, random_seed: int = 42,
                 replay_config: ReplayBufferConfig | None = None, sampling: str | None = None,
                 **kwargs: Any) -> None:
        if buffer_num < 1:
            from rlaccel_plugins.errors import invalid

            raise invalid("buffer_num", "be >= 1", buffer_num)
        replay, layout = _tier_settings(total_size, buffer_num, preset, dict(
            level_capacity=level_capacity, levels=len(level_capacity) if level_capacity else None,
            sampling_ratio=sampling_ratio, ratio_schedule=ratio_schedule, anneal_steps=anneal_steps,
            importance_beta=importance_beta, sampling=sampling), replay_config)
        # independent streams: Tianshou gives every sub-buffer RandomState(42)
        children = [LinkedSubBuffer(layout.total_rows, random_seed=random_seed + i, **kwargs) for i in range(buffer_num)]
        super().__init__(children)
        self._init_tiered(replay, layout, random_seed)

    def _stream_state(self) -> tuple[np.ndarray, np.ndarray]:
        sizes = np.array([len(b) for b in self.buffers])
        positions = np.array([b._insertion_idx for b in self.buffers])
        return sizes, positions

    def _stream_starts(self) -> np.ndarray:
        return np.asarray(self._offset, dtype=np.int64)

    def _stream_capacity(self) -> np.ndarray:
        return np.array([b.maxsize for b in self.buffers])

    def _global_index(self, streams: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self._offset[streams] + rows

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self._meta.get_keys():  # re-link the sub-buffers to the shared storage (lost by pickling)
            self._set_batch_for_children()




class LinkedSubBuffer(ReplayBuffer):
    """A sub-buffer of :class:`TieredVectorReplayBuffer`: its storage is a view of the manager's, so it
    pickles without it (the manager re-links it on load) instead of as a second copy."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_meta": Batch()}
