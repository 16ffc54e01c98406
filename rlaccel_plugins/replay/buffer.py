"""`TieredReplay`: the framework-agnostic tiered replay engine."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from rlaccel_plugins.config import AUTO, ERE_SETTINGS, AccelConfig, ReplayBufferConfig
from rlaccel_plugins.errors import ConfigError, invalid
from rlaccel_plugins.replay.evidence import resolve_sampling
from rlaccel_plugins.replay.sampler import SampledIndices
from rlaccel_plugins.replay.schemes import make_sampler
from rlaccel_plugins.replay.storage import FrameStackStorage, RingStorage
from rlaccel_plugins.replay.tiers import TierLayout

STATE_VERSION = 1
OBS, NEXT_OBS = "obs", "next_obs"


@dataclass
class Sample:
    """A sampled batch: ``data`` (field -> array, batch first), flat ``indices``
    (``row * num_envs + env``), ``levels`` (level id per row) and ``weights`` (or ``None``)."""

    data: dict[str, np.ndarray]
    indices: np.ndarray
    levels: np.ndarray
    weights: np.ndarray | None


class TieredReplay:
    """Replay buffer split into levels L0 (newest) .. L{n-1} (long-term), sampled per-level ratios.

    One ring per env stream holds ``sum(level_capacity)`` transitions; a transition's level follows
    from its age, so promotion costs nothing. ``sample(B)`` splits ``B`` across the filled levels by
    their ratios (renormalised over those levels) and draws uniformly inside each level.

    Args:
        level_capacity: transitions per level, newest first.
        sampling_ratio: share of each batch per level (sums to 1).
        num_envs: env streams added in lock-step (each add carries a leading ``num_envs`` dim).
        ratio_schedule: ``"constant"`` or ``"anneal"`` (toward uniform over ``anneal_steps``).
        anneal_steps: transitions added over which ``anneal`` reaches uniform (and ERE's eta reaches 1).
        importance_beta: ``None`` (no weights) or the beta of ``(N*P)^-beta / max w``.
        dedup_frames: ``"auto"`` (on for uint8 ``obs`` of shape ``(k, H, W)`` with ``next_obs``),
            ``True`` or ``False``.
        sampling: ``"tiers"`` (the ratios above), ``"uniform"``, ``"ere"`` or ``"cer"``
            (:mod:`rlaccel_plugins.replay.schemes`); ERE's settings by keyword: ``ere_eta``,
            ``ere_c_min``, ``ere_updates``.
        seed: seed of the buffer's own sampling RNG.

    Examples:
        >>> import numpy as np, rlaccel_plugins as rla
        >>> buf = rla.TieredReplay(level_capacity=[4, 12], sampling_ratio=[0.5, 0.5], num_envs=2, seed=0)
        >>> for t in range(10):
        ...     buf.add(obs=np.full((2, 3), t, np.float32), action=np.zeros(2, np.int64),
        ...             reward=np.ones(2, np.float32), next_obs=np.full((2, 3), t + 1, np.float32),
        ...             terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
        >>> len(buf), buf.level_sizes
        (16, [4, 12])
        >>> s = buf.sample(8)
        >>> s.data["obs"].shape, sorted(s.levels.tolist())
        ((8, 3), [0, 0, 0, 0, 1, 1, 1, 1])
    """

    def __init__(self, level_capacity: Sequence[int] = (1000, 5000, 20000, 100000),
                 sampling_ratio: Sequence[float] = (0.7, 0.2, 0.08, 0.02), num_envs: int = 1, *,
                 ratio_schedule: str = "constant", anneal_steps: int = 1_000_000,
                 importance_beta: float | None = None, dedup_frames: bool | str = AUTO,
                 sampling: str = "tiers", seed: int | None = None, **scheme: Any) -> None:
        if not _sized(level_capacity):
            raise invalid("level_capacity", "be a list of positive integers", level_capacity)
        self.config = resolve_sampling(ReplayBufferConfig(levels=len(level_capacity),
                                         level_capacity=level_capacity,  # type: ignore[arg-type]  # validated there
                                         sampling_ratio=sampling_ratio,  # type: ignore[arg-type]
                                         ratio_schedule=ratio_schedule, anneal_steps=anneal_steps,
                                         importance_beta=importance_beta, dedup_frames=dedup_frames,
                                         sampling=sampling, **scheme))  # auto: no algorithm known here
        self.layout = TierLayout(self.config.level_capacity, num_envs)
        self.sampler = make_sampler(self.layout, self.config, seed)
        self.num_envs = self.layout.num_envs
        self.pos = 0          # next row to write
        self.full = False
        self.added = 0        # transitions added since creation (drives the anneal schedule)
        # None until the first add() or allocate(); typed as what the add/sample paths read
        self.specs: dict[str, tuple[tuple[int, ...], np.dtype]] = None  # type: ignore[assignment]
        self.storage: RingStorage = None  # type: ignore[assignment]
        self.frames: FrameStackStorage | None = None

    @classmethod
    def from_config(cls, config: AccelConfig | ReplayBufferConfig, num_envs: int = 1,
                    seed: int | None = None) -> TieredReplay:
        """Build from an :class:`AccelConfig` (its ``replay_buffer`` block) or the block itself.

        Examples:
            >>> import rlaccel_plugins as rla
            >>> buf = rla.TieredReplay.from_config(rla.get_preset("atari"), num_envs=8)
            >>> buf.capacity
            126000
        """
        rb = config.replay_buffer if isinstance(config, AccelConfig) else config
        return cls(rb.level_capacity, rb.sampling_ratio, num_envs, ratio_schedule=rb.ratio_schedule,
                   anneal_steps=rb.anneal_steps, importance_beta=rb.importance_beta,
                   dedup_frames=rb.dedup_frames, sampling=rb.sampling, seed=seed,
                   **{name: getattr(rb, name) for name in ERE_SETTINGS})

    # ------------------------------------------------------------------ sizes
    @property
    def capacity(self) -> int:
        """Transitions the buffer holds when full."""
        return self.layout.capacity

    @property
    def stored_rows(self) -> int:
        return self.layout.total_rows if self.full else self.pos

    def __len__(self) -> int:
        return self.stored_rows * self.num_envs

    @property
    def level_sizes(self) -> list[int]:
        """Transitions stored in each level now."""
        return (self.layout.filled_rows(self.stored_rows) * self.num_envs).tolist()

    @property
    def level_samples(self) -> list[int]:
        """Transitions drawn from each level since creation."""
        return self.sampler.level_samples.tolist()

    @property
    def nbytes(self) -> int:
        """Bytes of all storage (allocated at the first add)."""
        return (self.storage.nbytes if self.storage else 0) + (self.frames.nbytes if self.frames else 0)

    def stats(self) -> dict[str, float]:
        """Monitoring counters: ``level_fill/Li`` (0..1) and ``level_samples/Li`` per level."""
        out = {}
        for i, (size, cap, drawn) in enumerate(zip(self.level_sizes, self.layout.rows_per_level * self.num_envs,
                                                   self.level_samples)):
            out[f"level_fill/L{i}"] = size / cap
            out[f"level_samples/L{i}"] = drawn
        return out

    # ------------------------------------------------------------------ writing
    def add(self, **fields: Any) -> None:
        """Add one lock-step row: every field has a leading ``num_envs`` dimension.

        Fields, shapes and dtypes are fixed by the first add; later adds must match (values are cast
        with numpy's ``same_kind`` rule, e.g. float64 -> float32; int -> float is refused). A bad add
        raises before anything is written.
        """
        if self.specs is None:
            self._allocate(fields)
        self._write(self._check(fields))

    def add_rows(self, fields: dict[str, np.ndarray], finite: Collection[str] = ()) -> None:
        """:meth:`add` for a caller that already gives every field exactly as :attr:`row_specs` says
        (shape and dtype: an adapter that converts values the way its framework stores them), so the
        schema is not checked again on every add; values still are (NaN/Inf refused), except in the
        ``finite`` fields, which the caller knows hold no NaN (e.g. converted from booleans). Allocate
        first (:meth:`allocate`)."""
        if fields.keys() != self._expected.keys():
            self._check(fields)  # raises, naming the missing/extra fields
        self._refuse_nonfinite(fields, finite)
        self._write(dict(fields))

    def write_rows(self, fields: dict[str, np.ndarray]) -> None:
        """Only the write of :meth:`add_rows`: for a caller that has given every field exactly as
        :attr:`row_specs` says and refused NaN/Inf itself (an adapter's fast path for the common case)."""
        self._write(fields)

    def _write(self, values: dict[str, np.ndarray]) -> None:
        row = self.pos
        if self.frames is not None:
            wraps = self.full or row + 1 == self.layout.total_rows
            oldest = (row + 1) % self.layout.total_rows if wraps else (0 if row > 0 else None)
            dtype = self.frames.dtype  # compared bitwise, so cast first
            self.frames.write(row, values.pop(OBS).astype(dtype, copy=False),
                              values.pop(NEXT_OBS).astype(dtype, copy=False), oldest)
        for name, array in values.items():
            self.storage.arrays[name][row] = array  # numpy casts (same_kind was checked)
        self.pos = (row + 1) % self.layout.total_rows
        self.full = self.full or self.pos == 0
        self.added += self.num_envs

    def _allocate(self, fields: dict[str, Any]) -> None:
        if not fields:
            raise ConfigError("add() needs at least one field, got no fields. "
                              "Call e.g. add(obs=o, action=a, reward=r, next_obs=o2, terminated=d, truncated=t).")
        specs = {}
        for name, value in fields.items():
            array = np.asarray(value)
            if array.ndim == 0 or array.shape[0] != self.num_envs:
                raise invalid(f"{name}.shape", f"start with num_envs={self.num_envs}", array.shape,
                              "Stack one entry per env (for one env: value[None]).")
            specs[name] = (array.shape[1:], array.dtype)
        self.allocate(specs)

    def allocate(self, specs: dict[str, tuple[tuple[int, ...], Any]]) -> None:
        """Allocate storage for fields ``{name: (per-env shape, dtype)}`` before the first add.

        Adapters whose framework knows the spaces up front call this; otherwise the first
        :meth:`add` does it. Zero-filled, like the frameworks' own buffers.
        """
        specs = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in specs.items()}
        dedup = self.config.dedup_frames
        obs_spec, next_spec = specs.get(OBS), specs.get(NEXT_OBS)
        pixels = obs_spec is not None and obs_spec == next_spec
        if dedup == AUTO:
            dedup = pixels and obs_spec is not None and obs_spec[1] == np.uint8 and len(obs_spec[0]) == 3
        elif dedup and not pixels:
            raise ConfigError("dedup_frames=True needs fields 'obs' and 'next_obs' of the same shape and dtype, "
                              f"got obs={obs_spec} next_obs={next_spec}. Pass dedup_frames=False.")
        plain = {k: v for k, v in specs.items() if not (dedup and k in (OBS, NEXT_OBS))}
        self.frames = FrameStackStorage(self.layout.total_rows, self.num_envs, *obs_spec) \
            if dedup and obs_spec is not None else None
        self.storage = RingStorage(self.layout.total_rows, self.num_envs, plain)
        self.specs = specs
        self._expected = {name: ((self.num_envs, *shape), dtype) for name, (shape, dtype) in specs.items()}

    @property
    def row_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """``{field: ((num_envs, *shape), dtype)}``: what one :meth:`add` takes per field (after allocation)."""
        return self._expected

    def _check(self, fields: dict[str, Any]) -> dict[str, np.ndarray]:
        # the hot path of every add: one dict lookup, a shape and a dtype comparison per field
        expected = self._expected
        if len(fields) != len(expected) or not all(name in expected for name in fields):
            missing, extra = sorted(expected.keys() - fields.keys()), sorted(fields.keys() - expected.keys())
            raise ConfigError(f"add() fields must match the first add {sorted(expected)}, got missing={missing} "
                              f"extra={extra}. Pass the same fields on every add.")
        values = {}
        for name, value in fields.items():
            shape, dtype = expected[name]
            array = value if type(value) is np.ndarray else np.asarray(value)
            if array.shape != shape:
                raise invalid(f"{name}.shape", f"be {shape} as on the first add", array.shape)
            if array.dtype is not dtype and array.dtype != dtype and not self._castable(array.dtype, dtype):
                raise invalid(f"{name}.dtype", f"be castable to {dtype} (fixed by the first add)",
                              str(array.dtype), f"Convert with .astype({dtype.name!r}).")
            values[name] = array
        self._refuse_nonfinite(values)
        return values

    @staticmethod
    def _refuse_nonfinite(fields: dict[str, np.ndarray], finite: Collection[str] = ()) -> None:
        for name, array in fields.items():
            if array.dtype.kind != "f" or name in finite:
                continue
            # a few values (CartPole's obs, a reward): Python's isfinite on a list is ~5x cheaper than two ufuncs
            ok = all(map(math.isfinite, array.ravel().tolist())) if array.size <= 64 else np.isfinite(array).all()
            if not ok:
                bad = sorted({int(i) for i in np.argwhere(~np.isfinite(array))[:, 0]})
                raise ConfigError(f"{name} must hold finite numbers, got NaN/Inf for envs {bad} (it would reach "
                                  "every update that samples it). Nothing was stored. Fix the env's observations/"
                                  "rewards, e.g. with gymnasium.wrappers.TransformObservation.")

    @staticmethod
    @lru_cache(maxsize=256)
    def _castable(source: np.dtype, target: np.dtype) -> bool:
        return bool(np.can_cast(source, target, casting="same_kind"))

    def reset(self) -> None:
        """Forget every transition (storage stays allocated; counters of samples are kept)."""
        self.pos, self.full = 0, False
        if self.frames is not None:
            self.frames.forget_episode()

    # ------------------------------------------------------------------ reading
    def sample_indices(self, batch_size: int) -> SampledIndices:
        """Draw where a batch lies (rows, envs, levels, weights) without gathering data."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise invalid("batch_size", "be a positive integer", batch_size)
        if self.stored_rows == 0:
            raise ValueError("cannot sample from an empty buffer: add transitions first.")
        progress = self.added / self.config.anneal_steps
        return self.sampler.draw(int(batch_size), self.stored_rows, self.pos, progress)

    def sample(self, batch_size: int) -> Sample:
        """Sample ``batch_size`` transitions (with replacement, so it may exceed ``len(self)``)."""
        where = self.sample_indices(batch_size)
        return Sample(data=self.gather(where.rows, where.envs), indices=where.rows * self.num_envs + where.envs,
                      levels=where.levels, weights=where.weights)

    def gather(self, rows: np.ndarray, envs: np.ndarray, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Data of the transitions at physical ``rows`` and env streams ``envs`` (all or some ``fields``)."""
        names = list(self.specs) if fields is None else list(fields)
        data = self.storage.gather(rows, envs, names)
        if self.frames is not None and (OBS in names or NEXT_OBS in names):
            data.update(self.frames.gather(rows, envs, names))
        return {name: data[name] for name in names}

    def age_of(self, rows: np.ndarray) -> np.ndarray:
        """Age of physical rows (0 = the newest row)."""
        return (self.pos - 1 - np.asarray(rows)) % self.layout.total_rows

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        """Pickled with what is stored: until the ring wraps, only the rows (and frames) written so
        far, so a 1M-transition buffer holding 2,000 transitions pickles as 2,000 rows."""
        state = self.__dict__.copy()
        if not self.full:
            state["storage"] = self.storage.trimmed(self.pos) if self.storage is not None else None
            state["frames"] = self.frames.trimmed(self.pos) if self.frames is not None else None
        return state

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-exactly (arrays are shared, not copied)."""
        return {
            "version": STATE_VERSION, "config": self.config, "num_envs": self.num_envs,
            "pos": self.pos, "full": self.full, "added": self.added, "specs": self.specs,
            "sampler": self.sampler.state_dict(),
            "storage": self.storage.state_dict() if self.storage else None,
            "frames": self.frames.state_dict() if self.frames else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the layout (capacities, ratios, env count) must match."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"state must be a TieredReplay state_dict of version {STATE_VERSION}, "
                             f"got version={state.get('version') if isinstance(state, dict) else type(state)!r}.")
        if state["config"] != self.config or state["num_envs"] != self.num_envs:
            raise ValueError(f"state must come from a buffer with the same layout, got config={state['config']} "
                             f"num_envs={state['num_envs']}; this buffer has config={self.config} "
                             f"num_envs={self.num_envs}. Build the buffer with the saved settings.")
        self.specs = None  # type: ignore[assignment]
        if state["specs"] is not None:
            self.allocate(state["specs"])
            self.storage.load_state_dict(state["storage"])
            if self.frames is not None:
                self.frames.load_state_dict(state["frames"])
        self.pos, self.full, self.added = int(state["pos"]), bool(state["full"]), int(state["added"])
        self.sampler.load_state_dict(state["sampler"])


def _sized(value: Any) -> bool:
    return hasattr(value, "__len__") and not isinstance(value, (str, bytes))
