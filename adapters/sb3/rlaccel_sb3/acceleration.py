"""`accelerate(model)` and `restore(model)`: switch rlaccel on and off for an existing SB3 model."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer

from rlaccel_plugins.config import AccelConfig, load_config
from rlaccel_sb3.buffers import TieredBufferMixin, TieredDictReplayBuffer, TieredReplayBuffer
from rlaccel_sb3.callback import SparseDenseCallback

logger = logging.getLogger("rlaccel")


@dataclass
class _Swap:
    original: Any                 # the model's own buffer (None for on-policy models)
    copied_rows: int              # rows copied into the tiered buffer at accelerate()
    callbacks: list = field(default_factory=list)


_SWAPS: weakref.WeakKeyDictionary[BaseAlgorithm, _Swap] = weakref.WeakKeyDictionary()


def accelerate(model: BaseAlgorithm, preset: str | None = None, **overrides: Any) -> SparseDenseCallback:
    """Switch rlaccel on for an existing SB3 model; returns the callback to pass to ``learn``.

    The model's replay buffer (off-policy algorithms) is replaced by a :class:`TieredReplayBuffer`
    holding the same transitions; the model's hyper-parameters are **not** changed — differences
    from the preset are reported (logged, and printed when ``model.verbose``). ``model.save()``
    output is unchanged (the buffer is never part of it). :func:`restore` undoes everything.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> import rlaccel_sb3
        >>> model = DQN("MlpPolicy", "CartPole-v1", learning_starts=0)
        >>> callback = rlaccel_sb3.accelerate(model, preset="classic_control")
        >>> type(model.replay_buffer).__name__
        'TieredReplayBuffer'
        >>> rlaccel_sb3.restore(model)
        >>> type(model.replay_buffer).__name__
        'ReplayBuffer'
    """
    if model in _SWAPS:
        restore(model)
    config = load_config(preset=preset, **overrides)
    for line in hyperparameter_report(model, config):
        logger.info("rlaccel: %s", line)
        if getattr(model, "verbose", 0):
            print(f"rlaccel: {line}")
    original = getattr(model, "replay_buffer", None)
    swapped = isinstance(original, ReplayBuffer) and not isinstance(original, TieredBufferMixin)
    copied = 0
    if swapped:
        explicit_tiers = preset is not None or "level_capacity" in overrides or "replay_buffer" in overrides
        model.replay_buffer, copied = _tiered_copy(model, original, config, preset, explicit_tiers)
    callback = SparseDenseCallback(config=config)
    _SWAPS[model] = _Swap(original=original if swapped else None, copied_rows=copied, callbacks=[callback])
    return callback


def restore(model: BaseAlgorithm) -> None:
    """Undo :func:`accelerate`: the original buffer comes back holding every transition collected
    meanwhile (newest last), and every parameter's ``requires_grad`` is restored."""
    swap = _SWAPS.pop(model, None)
    if swap is None:
        return
    for callback in swap.callbacks:
        callback.teardown()
    tiered = getattr(model, "replay_buffer", None)
    if swap.original is not None and isinstance(tiered, TieredBufferMixin):
        new_rows = len(tiered.engine) // tiered.n_envs - swap.copied_rows
        _copy_rows(tiered, swap.original, max(new_rows, 0))
        model.replay_buffer = swap.original


def hyperparameter_report(model: BaseAlgorithm, config: AccelConfig) -> list[str]:
    """Where the model's settings differ from the preset's (never applied to an existing model)."""
    wanted = {"batch_size": config.training.batch_size, "learning_rate": config.training.learning_rate,
              "n_envs": config.training.parallel_envs}
    if config.precision.max_grad_norm is not None:
        wanted["max_grad_norm"] = config.precision.max_grad_norm
    lines = []
    for name, value in wanted.items():
        current = getattr(model, name, None)
        if current is not None and not callable(current) and value != "auto" and current != value:
            lines.append(f"{name}: model has {current!r}, preset {config.preset!r} suggests {value!r} (not changed; "
                         "set it when you build the model to use it)")
    return lines


def _tiered_copy(model: BaseAlgorithm, original: ReplayBuffer, config: AccelConfig, preset: str | None,
                 explicit_tiers: bool):
    cls = TieredDictReplayBuffer if isinstance(original, DictReplayBuffer) else TieredReplayBuffer
    rb = config.replay_buffer
    tiered = cls(model.buffer_size, model.observation_space, model.action_space, device=model.device,
                 n_envs=model.n_envs, optimize_memory_usage=original.optimize_memory_usage,
                 handle_timeout_termination=original.handle_timeout_termination,
                 preset=preset, level_capacity=list(rb.level_capacity) if explicit_tiers else None,
                 sampling_ratio=list(rb.sampling_ratio), ratio_schedule=rb.ratio_schedule,
                 anneal_steps=rb.anneal_steps, importance_beta=rb.importance_beta)
    rows = original.size()
    _copy_rows(original, tiered, rows)
    return tiered, rows


def _copy_rows(source: ReplayBuffer, target: ReplayBuffer, rows: int) -> None:
    """Append the newest ``rows`` rows of ``source`` to ``target``, oldest first."""
    infos = None
    for age in range(rows - 1, -1, -1):
        row = (source.pos - 1 - age) % source.buffer_size
        obs, next_obs, action, reward, done, timeout = _row(source, row)
        infos = [{"TimeLimit.truncated": bool(t)} for t in timeout]
        target.add(obs, next_obs, action, reward, done, infos)


def _row(buffer: ReplayBuffer, row: int):
    if isinstance(buffer, TieredBufferMixin):
        envs = np.arange(buffer.n_envs)
        data = buffer.engine.gather(np.full(buffer.n_envs, row), envs)
        obs, next_obs = buffer._obs_from(data, "obs", None), buffer._obs_from(data, "next_obs", None)
        return obs, next_obs, data["action"], data["reward"], data["done"], data["timeout"]
    if isinstance(buffer.observations, dict):
        obs = {k: v[row] for k, v in buffer.observations.items()}
        next_obs = {k: v[row] for k, v in buffer.next_observations.items()}
    elif buffer.optimize_memory_usage:
        obs, next_obs = buffer.observations[row], buffer.observations[(row + 1) % buffer.buffer_size]
    else:
        obs, next_obs = buffer.observations[row], buffer.next_observations[row]
    return obs, next_obs, buffer.actions[row], buffer.rewards[row], buffer.dones[row], buffer.timeouts[row]
