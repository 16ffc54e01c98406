"""One collector step written straight into a Tianshou vector buffer's storage.

``ReplayBufferManager.add`` copies the step's ``Batch`` into a new one, sets its ``done``, and assigns it
key by key into the storage; the collector first stacks every env's info dict into a ``Batch`` for it. For
a step whose fields are numeric arrays of the storage's shapes and whose infos hold the storage's keys
(nested dicts included, as envpool's) with scalar values — every step of a gymnasium env on Tianshou's vector envs, once the first step has
allocated the storage — :func:`add_step` does the same writes from the arrays themselves, and the same
per-sub-buffer bookkeeping through Tianshou's own ``_update_state_pre_add``. Any other step returns None
before touching the buffer, and the caller adds it as Tianshou does.
"""

from __future__ import annotations

import numpy as np
from tianshou.data import Batch, ReplayBuffer, ReplayBufferManager, VectorReplayBuffer
from tianshou.data.buffer.buffer_base import MalformedBufferError

from rlaccel_tianshou.buffers import LinkedSubBuffer, TieredVectorReplayBuffer

_MANAGERS = (ReplayBufferManager, VectorReplayBuffer, TieredVectorReplayBuffer)
_SUB_BUFFERS = (ReplayBuffer, LinkedSubBuffer)  # plain storage: a sub-buffer of the tiered one only pickles apart
_NUMERIC = frozenset("biufc")  # what Batch stores as an array as it is (np.bool_ and np.number)
_SCALARS = frozenset({bool, int, float, np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                      np.uint32, np.uint64, np.float16, np.float32, np.float64})


def supports(buffer: ReplayBuffer) -> bool:
    """Whether :func:`add_step` can write for this buffer: Tianshou's vector buffer (or rlaccel's tiered one)
    over plain sub-buffers, without ``save_only_last_obs``.

    Examples:
        >>> from tianshou.data import VectorReplayBuffer, PrioritizedVectorReplayBuffer
        >>> supports(VectorReplayBuffer(100, 2)), supports(PrioritizedVectorReplayBuffer(100, 2, alpha=0.6, beta=0.4))
        (True, False)
    """
    return (type(buffer) in _MANAGERS and not buffer._save_only_last_obs
            and all(type(sub) in _SUB_BUFFERS for sub in buffer.buffers))


def _fits(value: object, column: object, rows: int) -> bool:
    return (type(value) is np.ndarray and type(column) is np.ndarray and value.dtype.kind in _NUMERIC
            and column.dtype.kind in _NUMERIC and value.shape[:1] == (rows,) and value.shape[1:] == column.shape[1:])


def _info_columns(stored: Batch, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], np.ndarray]] | None:
    """The stored infos' leaf arrays with their key paths (envpool nests ``players``), or None where one is
    not a 1-d numeric array."""
    columns = []
    for key, column in stored.__dict__.items():
        if isinstance(column, Batch):
            nested = _info_columns(column, (*path, key))
            if nested is None:
                return None
            columns += nested
        elif type(column) is np.ndarray and column.ndim == 1 and column.dtype.kind in _NUMERIC:
            columns.append(((*path, key), column))
        else:
            return None
    return columns


def _infos_fit(infos: np.ndarray, stored: Batch, flat: bool) -> bool:
    """Whether every info fits the stored ones (:func:`_info_fits`); ``flat``: the stored infos hold no
    nested ``Batch`` (gymnasium's infos), checked in one pass."""
    if not flat:
        return all(_info_fits(info, stored) for info in infos)
    keys = stored.__dict__.keys()
    for info in infos:
        if type(info) is not dict or info.keys() != keys:
            return False
        for value in info.values():
            if type(value) not in _SCALARS:
                return False
    return True


def _info_fits(info: object, stored: Batch) -> bool:
    """Whether ``info`` holds exactly the stored keys, at every level, with scalar leaves."""
    if type(info) is not dict or info.keys() != stored.__dict__.keys():
        return False
    for key, value in info.items():
        column = stored.__dict__[key]
        if not (_info_fits(value, column) if isinstance(column, Batch) else type(value) in _SCALARS):
            return False
    return True


def _leaf(info: dict, path: tuple[str, ...]) -> object:
    for key in path:
        info = info[key]
    return info


def add_step(buffer: ReplayBufferManager, buffer_ids: np.ndarray, fields: dict[str, np.ndarray], infos: np.ndarray,
             policy_entry: Batch) -> tuple[np.ndarray, list, list] | None:
    """``buffer.add(Batch(**fields, info=infos, policy=policy_entry), buffer_ids)``, or None (nothing written).

    ``fields`` holds ``obs``, ``act``, ``rew`` (one per env), ``terminated``, ``truncated``, ``done`` and
    ``obs_next``. Returns the insertion indices as ``add`` does, and per env the episode's return where
    it ended (0.0 where it goes on) and its start index, as lists.

    Examples:
        >>> from tianshou.data import VectorReplayBuffer
        >>> buf = VectorReplayBuffer(10, 2)
        >>> step = dict(obs=np.zeros((2, 3), np.float32), act=np.array([0, 1]), rew=np.array([1.0, 2.0]),
        ...             terminated=np.array([False, True]), truncated=np.array([False, False]))
        >>> step.update(done=step["terminated"] | step["truncated"], obs_next=step["obs"] + 1)
        >>> infos = np.array([{"env_id": 0}, {"env_id": 1}])
        >>> add_step(buf, np.arange(2), step, infos, Batch()) is None  # no storage yet: Tianshou allocates it
        True
        >>> _ = buf.add(Batch(**step, info=infos, policy=Batch()), np.arange(2))
        >>> add_step(buf, np.arange(2), step, infos, Batch())[0], buf.rew[:7]
        (array([1, 6]), array([1., 1., 0., 0., 0., 2., 2.]))
    """
    meta = buffer._meta
    stored = meta.__dict__
    rows = len(buffer_ids)
    if not buffer._save_obs_next:
        fields = {key: value for key, value in fields.items() if key != "obs_next"}
    if stored.keys() != {*fields, "info", "policy"} or policy_entry.__dict__ or stored["policy"].__dict__:
        return None
    for key, value in fields.items():
        if not _fits(value, stored[key], rows):
            return None
    if fields["rew"].ndim != 1:  # a scalar return per episode (Tianshou's multi-agent rewards go through add)
        return None
    info_columns = _info_columns(stored["info"])
    if info_columns is None or type(infos) is not np.ndarray or infos.shape != (rows,) \
            or not _infos_fit(infos, stored["info"], all(len(path) == 1 for path, _ in info_columns)):
        return None

    subs, offsets, rew, done = buffer.buffers, buffer._offset, fields["rew"], fields["done"]
    insertion, returns, starts, sizes = [], [], [], []
    for batch_idx, buffer_id in enumerate(buffer_ids):
        # ReplayBuffer._update_state_pre_add, on the attributes themselves (ReplayBuffer.__setattr__ checks
        # each name against the reserved keys, which these are not: most of that method's cost)
        state = subs[buffer_id].__dict__
        state["last_index"][0] = index = state["_insertion_idx"]
        state["_size"] = size = min(state["_size"] + 1, state["maxsize"])
        state["_insertion_idx"] = (index + 1) % state["maxsize"]
        state["_ep_return"] = ep_return = state["_ep_return"] + rew[batch_idx]
        state["_ep_len"] += 1
        if state["_ep_start_idx"] > size:
            raise MalformedBufferError(
                f"Encountered a starting index {state['_ep_start_idx']} that is outside the currently available "
                f"samples len(self)={size}. The buffer is malformed. This might be caused by a bug or by manual "
                f"modifications of the buffer by users.")
        offset = offsets[buffer_id]
        insertion.append(index + offset)
        starts.append(state["_ep_start_idx"] + offset)
        sizes.append(size)
        if done[batch_idx]:
            returns.append(ep_return)
            state["_ep_return"], state["_ep_len"], state["_ep_start_idx"] = 0.0, 0, state["_insertion_idx"]
        else:
            returns.append(0.0)
    buffer.last_index[buffer_ids] = insertion
    buffer._lengths[buffer_ids] = sizes
    insertion = np.array(insertion)
    for key, value in fields.items():
        stored[key][insertion] = value
    for path, column in info_columns:
        column[insertion] = [_leaf(info, path) for info in infos]
    if isinstance(buffer, TieredVectorReplayBuffer):
        buffer.note_added(insertion)
    return insertion, returns, starts
