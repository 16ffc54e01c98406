"""Tianshou's buffer reads in a fused update (``sample_indices``, ``unfinished_index``): the same
results in fewer calls.

A ``VectorReplayBuffer`` of 10 sub-buffers samples a batch with one ``RandomState.choice(10, batch,
p=lengths)`` and then, per sub-buffer, a ``choice(size, n)`` from that sub-buffer's own
``RandomState``: eleven ``choice`` calls, each mostly argument checks (``benchmarks/update_overheads.py``).
:func:`sample_indices` makes the draws ``choice`` makes — ``random_sample`` against the cumulative
probabilities, ``randint`` for a uniform pick (``tests/equivalence/test_tianshou_fused.py`` checks both against
``choice`` itself) — on the same ``RandomState`` objects in the same order, so the indices and every
random state after the call are Tianshou's. :func:`unfinished_index` reads each sub-buffer's last
index from the manager's arrays instead of one call per sub-buffer.

Examples:
    >>> from tianshou.data import Batch, VectorReplayBuffer
    >>> import copy, numpy as np
    >>> buffer = VectorReplayBuffer(100, 2)
    >>> for t in range(20):
    ...     _ = buffer.add(Batch(obs=np.full((2, 1), t), act=[0, 1], rew=[1.0, 1.0], terminated=[False, False],
    ...                          truncated=[False, False], obs_next=np.full((2, 1), t + 1), info={}))
    >>> twin = copy.deepcopy(buffer)
    >>> np.array_equal(sample_indices(buffer, 8), twin.sample_indices(8))
    True
"""

from __future__ import annotations

import numpy as np


def _managed(buffer) -> bool:
    """Whether ``buffer`` is Tianshou's own manager of Tianshou's own ``ReplayBuffer`` s (``stack_num=1``)."""
    from tianshou.data import ReplayBuffer, ReplayBufferManager, VectorReplayBuffer

    return type(buffer) in (ReplayBufferManager, VectorReplayBuffer) and buffer.stack_num == 1 and all(
        type(child) is ReplayBuffer and child.stack_num == 1 for child in buffer.buffers)


def sample_indices(buffer, batch_size: int | None) -> np.ndarray:
    """``buffer.sample_indices(batch_size)`` for Tianshou's ``ReplayBuffer``, ``ReplayBufferManager`` and
    ``VectorReplayBuffer`` (exact classes, ``stack_num=1``, a positive ``batch_size``); any other case is
    the buffer's own method."""
    from tianshou.data import ReplayBuffer

    if batch_size is None or batch_size <= 0 or buffer.stack_num != 1:
        return buffer.sample_indices(batch_size)
    if type(buffer) is ReplayBuffer and buffer._size > 0:
        return buffer._random_state.randint(0, buffer._size, size=batch_size)
    if not _managed(buffer):
        return buffer.sample_indices(batch_size)
    lengths = buffer._lengths
    total = lengths.sum()
    if total <= 0:  # numpy's own error for NaN probabilities
        return buffer.sample_indices(batch_size)
    cdf = (lengths / total).cumsum()
    cdf /= cdf[-1]
    counts = np.bincount(cdf.searchsorted(buffer._random_state.random_sample(batch_size), side="right"),
                         minlength=buffer.buffer_num)
    # a sub-buffer drawn 0 times gives no indices (Tianshou asks it for -1: an empty array)
    return np.concatenate([child._random_state.randint(0, child._size, size=int(n)) + offset
                           for offset, child, n in zip(buffer._offset, buffer.buffers, counts) if n > 0])


def unfinished_index(buffer) -> np.ndarray:
    """``buffer.unfinished_index()``: the last index of each (sub-)buffer whose episode is still running."""
    if not _managed(buffer):
        return buffer.unfinished_index()
    done, last = buffer.done, []
    for offset, child in zip(buffer._offset, buffer.buffers):
        size = child._size
        if size and not done[offset + (child._insertion_idx - 1) % size]:  # the children's done is a view of it
            last.append(offset + (child._insertion_idx - 1) % size)
    return np.array(last, int)
