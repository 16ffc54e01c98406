"""Storage behind the tiered ring: plain named fields, and de-duplicated stacked frames.

`RingStorage` keeps each field as one array ``(rows, num_envs, *shape)``.
`FrameStackStorage` keeps ``obs``/``next_obs`` pairs of stacked frames ``(k, *frame)`` (e.g. 4x84x84
uint8) as single frames stored once, plus ``k`` frame ids per observation. Consecutive stacks share
``k - 1`` frames and ``next_obs`` of a step is ``obs`` of the next one, so a transition normally
costs one new frame. Both facts are *checked* on every add (bitwise), never assumed, so any
observation — episode starts, envs that pad stacks differently, resets — is rebuilt bit-exactly.
"""

from __future__ import annotations

import copy
import sys

import numpy as np

from rlaccel_plugins.errors import invalid

FRAME_SLACK = 0.02  # spare frames for episode starts (k extra frames each); grows if a run needs more


class RingStorage:
    """Named fields, each an array ``(rows, num_envs, *shape)``; shapes and dtypes fixed at creation."""

    def __init__(self, rows: int, num_envs: int, specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        self.specs = specs
        self.arrays = {name: np.zeros((rows, num_envs, *shape), dtype=dtype) for name, (shape, dtype) in specs.items()}

    def gather(self, rows: np.ndarray, envs: np.ndarray, names=None) -> dict[str, np.ndarray]:
        return {name: array[rows, envs] for name, array in self.arrays.items() if names is None or name in names}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def state_dict(self) -> dict:
        return dict(self.arrays)

    def load_state_dict(self, state: dict) -> None:
        for name, array in self.arrays.items():
            array[...] = state[name]

    def trimmed(self, rows: int) -> RingStorage:
        """A shallow copy holding only the first ``rows`` rows, to pickle; unpickled, it is whole again
        (the rest zero-filled, as a fresh buffer allocates it)."""
        out = copy.copy(self)
        out.arrays = {name: array[:rows] for name, array in self.arrays.items()}
        out._full_rows = next(  # type: ignore[attr-defined]  # read back by __setstate__
            iter(self.arrays.values())).shape[0] if self.arrays else 0
        return out

    def __setstate__(self, state: dict) -> None:
        full_rows = state.pop("_full_rows", None)
        self.__dict__.update({sys.intern(k): v for k, v in state.items()})  # as pickle's own setstate
        if full_rows is not None:
            self.arrays = {name: _padded(array, full_rows) for name, array in self.arrays.items()}


def _padded(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` at the start of a zero-filled array of ``rows`` leading rows."""
    out = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    out[: len(array)] = array
    return out


def _same_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per leading index: are ``a[i]`` and ``b[i]`` bitwise equal? (compares 8 bytes at a time)."""
    a2 = np.ascontiguousarray(a).reshape(len(a), -1).view(np.uint8)
    b2 = np.ascontiguousarray(b).reshape(len(b), -1).view(np.uint8)
    if a2.shape[1] % 8 == 0:
        a2, b2 = a2.view(np.uint64), b2.view(np.uint64)
    return (a2 == b2).all(axis=1)


class FrameStackStorage:
    """``obs``/``next_obs`` of shape ``(k, *frame)`` stored as de-duplicated frames.

    Frames live in one FIFO pool addressed by absolute frame ids (``id % pool_size`` is the slot).
    A row's frames are never older than those of the row before it, so the oldest live row bounds
    the frames in use; the pool grows (rarely) when episode starts need more than its slack.
    """

    def __init__(self, rows: int, num_envs: int, stack_shape: tuple[int, ...], dtype: np.dtype) -> None:
        if len(stack_shape) < 2:
            raise invalid("obs shape", "be (stack, *frame) for frame de-duplication", stack_shape,
                          "Pass dedup_frames=False for flat observations.")
        self.rows, self.num_envs = rows, num_envs
        self.stack = stack_shape[0]
        self.frame_shape = tuple(stack_shape[1:])
        self.dtype = np.dtype(dtype)
        pool = int(rows * num_envs * (1 + FRAME_SLACK)) + 2 * self.stack * num_envs
        self.frames = np.zeros((pool, *self.frame_shape), dtype=self.dtype)
        self.head = 0  # absolute id of the next frame written
        self.obs_ids = np.zeros((rows, num_envs, self.stack), dtype=np.int64)
        self.next_ids = np.zeros((rows, num_envs, self.stack), dtype=np.int64)
        self.last_next = np.zeros((num_envs, *stack_shape), dtype=self.dtype)
        self.last_next_ids = np.zeros((num_envs, self.stack), dtype=np.int64)
        self.has_last = np.zeros(num_envs, dtype=bool)

    @property
    def pool_size(self) -> int:
        return len(self.frames)

    def write(self, row: int, obs: np.ndarray, next_obs: np.ndarray, oldest_row: int | None) -> None:
        """Store one lock-step row; ``oldest_row`` is the oldest row still live after this write."""
        k = self.stack
        continues = self.has_last & _same_rows(obs, self.last_next)       # obs == previous next_obs
        shifted = _same_rows(next_obs[:, :-1], obs[:, 1:]) if k > 1 else np.ones(self.num_envs, bool)
        fresh_obs = np.flatnonzero(~continues)
        fresh_next = np.flatnonzero(~shifted)
        new_frames = [obs[fresh_obs].reshape(-1, *self.frame_shape),
                      next_obs[shifted, -1],
                      next_obs[fresh_next].reshape(-1, *self.frame_shape)]
        count = sum(len(f) for f in new_frames)
        self._reserve(count, self._oldest_live_id(oldest_row))
        ids = self.head + np.arange(count, dtype=np.int64)
        if count:
            self.frames[ids % self.pool_size] = np.concatenate(new_frames)
        self.head += count

        obs_ids = self.obs_ids[row]
        obs_ids[continues] = self.last_next_ids[continues]
        n_obs = len(fresh_obs) * k
        obs_ids[fresh_obs] = ids[:n_obs].reshape(-1, k)
        next_ids = self.next_ids[row]
        n_shift = int(shifted.sum())
        next_ids[shifted, :-1] = obs_ids[shifted, 1:]
        next_ids[shifted, -1] = ids[n_obs:n_obs + n_shift]
        next_ids[fresh_next] = ids[n_obs + n_shift:].reshape(-1, k)
        self.last_next[...] = next_obs
        self.last_next_ids[...] = next_ids
        self.has_last[:] = True

    def _oldest_live_id(self, oldest_row: int | None) -> int:
        tail = self.head if oldest_row is None else int(self.obs_ids[oldest_row, :, 0].min())
        if self.has_last.any():  # the pending next_obs may become this row's obs
            tail = min(tail, int(self.last_next_ids[self.has_last].min()))
        return tail

    def _reserve(self, count: int, tail: int) -> None:
        needed = self.head + count - tail
        if needed <= self.pool_size:
            return
        new_size = max(needed, self.pool_size + self.pool_size // 16)
        live = np.arange(tail, self.head, dtype=np.int64)
        frames = np.zeros((new_size, *self.frame_shape), dtype=self.dtype)
        frames[live % new_size] = self.frames[live % self.pool_size]
        self.frames = frames

    def gather(self, rows: np.ndarray, envs: np.ndarray, names=("obs", "next_obs")) -> dict[str, np.ndarray]:
        size, out = self.pool_size, {}
        if "obs" in names:
            out["obs"] = self.frames[self.obs_ids[rows, envs] % size]
        if "next_obs" in names:
            out["next_obs"] = self.frames[self.next_ids[rows, envs] % size]
        return out

    def forget_episode(self) -> None:
        """Make the next add start fresh stacks (after a reset of the buffer)."""
        self.has_last[:] = False

    @property
    def nbytes(self) -> int:
        return (self.frames.nbytes + self.obs_ids.nbytes + self.next_ids.nbytes
                + self.last_next.nbytes + self.last_next_ids.nbytes)

    def state_dict(self) -> dict:
        return {"frames": self.frames, "head": self.head, "obs_ids": self.obs_ids, "next_ids": self.next_ids,
                "last_next": self.last_next, "last_next_ids": self.last_next_ids, "has_last": self.has_last}

    def trimmed(self, rows: int) -> FrameStackStorage:
        """A shallow copy holding only the first ``rows`` rows and the frames written so far, to
        pickle (itself, when the frame ids have wrapped the pool); unpickled, it is whole again."""
        if self.head > len(self.frames):
            return self
        out = copy.copy(self)
        out.frames, out.obs_ids, out.next_ids = self.frames[: self.head], self.obs_ids[:rows], self.next_ids[:rows]
        out._full = (len(self.frames), len(self.obs_ids))  # type: ignore[attr-defined]  # for __setstate__
        return out

    def __setstate__(self, state: dict) -> None:
        full = state.pop("_full", None)
        self.__dict__.update({sys.intern(k): v for k, v in state.items()})  # as pickle's own setstate
        if full is not None:
            pool, rows = full
            self.frames = _padded(self.frames, pool)
            self.obs_ids, self.next_ids = _padded(self.obs_ids, rows), _padded(self.next_ids, rows)

    def load_state_dict(self, state: dict) -> None:
        self.frames = np.array(state["frames"], dtype=self.dtype, copy=True)
        self.head = int(state["head"])
        for name in ("obs_ids", "next_ids", "last_next", "last_next_ids", "has_last"):
            getattr(self, name)[...] = state[name]
