"""SB3's ``RolloutBuffer.get`` for PPO's and A2C's fused ``train()``: the same permutation draw, the
same batches of the same values, with each field gathered once.

SB3's ``_get_samples`` copies every field twice per batch — a numpy fancy index, then ``th.tensor`` —
and flattens four of them in between (a copy each). :func:`rollout_batches` makes the fancy index the
one copy (of the flat views for the four) and wraps it with ``torch.from_numpy``. Only for SB3's own ``RolloutBuffer``; any other buffer class (dict observations,
subclasses) gets its own ``get``.

Examples:
    >>> import gymnasium as gym, numpy as np
    >>> from stable_baselines3.common.buffers import RolloutBuffer
    >>> buffer = RolloutBuffer(4, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), n_envs=2)
    >>> buffer.full = True
    >>> [batch.observations.shape for batch in rollout_batches(buffer, 5)]
    [torch.Size([5, 3]), torch.Size([3, 3])]
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.type_aliases import RolloutBufferSamples

_FIELDS = ("observations", "actions", "values", "log_probs", "advantages", "returns")


def rollout_batches(buffer, batch_size: int | None = None) -> Iterator[RolloutBufferSamples]:
    """``buffer.get(batch_size)``: for SB3's ``RolloutBuffer``, the same batches gathered leanly."""
    if type(buffer) is not RolloutBuffer:
        return buffer.get(batch_size)
    return _gathered(buffer, batch_size)


def epoch_stacks(buffer, batch_size: int) -> bool:
    """Whether :func:`rollout_epoch` can give ``buffer``'s epoch: SB3's ``RolloutBuffer``, full, split into
    minibatches of one size (its rows a multiple of ``batch_size``)."""
    return type(buffer) is RolloutBuffer and buffer.full and (buffer.buffer_size * buffer.n_envs) % batch_size == 0


def rollout_epoch(buffer: RolloutBuffer, batch_size: int) -> RolloutBufferSamples:
    """Every minibatch of one epoch of ``buffer.get(batch_size)``, stacked: row ``j`` of each field is the
    ``j``-th batch (the same permutation draw, the same values). Only where :func:`epoch_stacks`.

    Examples:
        >>> import gymnasium as gym
        >>> buffer = RolloutBuffer(4, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), n_envs=2)
        >>> buffer.full = True
        >>> epoch_stacks(buffer, 4), rollout_epoch(buffer, 4).observations.shape
        (True, torch.Size([2, 4, 3]))
    """
    rows, indices, scalars = _prepared(buffer)
    batches = indices.reshape(rows // batch_size, batch_size)
    fields = [torch.from_numpy(buffer.observations[batches]),
              torch.from_numpy(buffer.actions[batches].astype(np.float32, copy=False)),
              *(torch.from_numpy(field[batches]) for field in scalars)]
    return RolloutBufferSamples(*(field.to(buffer.device) for field in fields))


def _prepared(buffer: RolloutBuffer) -> tuple[int, np.ndarray, list[np.ndarray]]:
    """SB3's ``get()`` up to the batches: the rows, the permutation draw, the flattened fields (made once),
    and the four per-row fields as flat views."""
    rows = buffer.buffer_size * buffer.n_envs
    indices = np.random.permutation(rows)
    if not buffer.generator_ready:
        for name in _FIELDS:
            buffer.__dict__[name] = buffer.swap_and_flatten(buffer.__dict__[name])
        buffer.generator_ready = True
    # values .. returns are (rows, 1): _get_samples flattens each batch of them
    return rows, indices, [buffer.__dict__[name].reshape(rows) for name in _FIELDS[2:]]


def _gathered(buffer: RolloutBuffer, batch_size: int | None) -> Iterator[RolloutBufferSamples]:
    # SB3's get() line for line up to the batches: the draw happens at the first next(), as there
    assert buffer.full, ""
    rows, indices, scalars = _prepared(buffer)
    if batch_size is None:
        batch_size = rows
    device = buffer.device
    for start in range(0, rows, batch_size):
        batch = indices[start:start + batch_size]
        # numpy's fancy index is the one copy; from_numpy wraps it (th.tensor would copy it again)
        fields = [torch.from_numpy(buffer.observations[batch]),
                  torch.from_numpy(buffer.actions[batch].astype(np.float32, copy=False)),
                  *(torch.from_numpy(field[batch]) for field in scalars)]
        if device.type != "cpu":
            fields = [field.to(device) for field in fields]
        yield RolloutBufferSamples(*fields)
