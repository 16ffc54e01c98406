"""`accelerate(model)` and `restore(model)`: switch rlaccel on and off for an existing SB3 model."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import DictReplayBuffer, NStepReplayBuffer, ReplayBuffer

from rlaccel_plugins.config import AccelConfig
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.loader import load_config
from rlaccel_plugins.replay.sizing import tiers_for_capacity
from rlaccel_sb3.buffers import TieredBufferMixin, TieredDictReplayBuffer, TieredReplayBuffer
from rlaccel_sb3.callback import AccelerateCallback, refuse_uncompilable
from rlaccel_sb3.fused import trains

logger = logging.getLogger("rlaccel")


# the buffer classes whose every behaviour the tiered buffer reproduces (n-step returns included)
SWAPPABLE = (ReplayBuffer, DictReplayBuffer, NStepReplayBuffer)


@dataclass
class _Swap:
    original: Any                 # the model's own buffer (None for on-policy models)
    added_at_swap: int            # transitions the tiered buffer had received when accelerate() returned
    callbacks: list = field(default_factory=list)


_SWAPS: weakref.WeakKeyDictionary[BaseAlgorithm, _Swap] = weakref.WeakKeyDictionary()


def accelerate(model: BaseAlgorithm, preset: str | None = None, *, tiered_replay: bool = True,
               **overrides: Any) -> AccelerateCallback:
    """Switch rlaccel on for an existing SB3 model; returns the callback to pass to ``learn``.

    The model's replay buffer (off-policy algorithms) is replaced by a :class:`TieredReplayBuffer`
    holding the same transitions and the same capacity (``buffer_size``; only an explicit
    ``level_capacity`` changes it, and that is reported). ``ReplayBuffer``, ``DictReplayBuffer`` and
    ``NStepReplayBuffer`` (its ``n_steps`` and ``gamma`` carried over) are swapped; any other buffer
    class (e.g. ``HerReplayBuffer``) is refused with a ``ConfigError``, since a tiered buffer would
    drop what it does — pass ``tiered_replay=False`` to keep it and use the rest. The model's
    hyper-parameters are **not** changed — differences from the preset are reported (logged, and
    printed when ``model.verbose``). ``model.save()`` output is unchanged (the buffer is never part
    of it). :func:`restore` undoes everything. A second call first restores, then re-applies.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> import rlaccel_sb3
        >>> model = DQN("MlpPolicy", "CartPole-v1", learning_starts=0)
        >>> callback = rlaccel_sb3.accelerate(model, preset="classic_control")
        >>> type(model.replay_buffer).__name__, model.replay_buffer.engine.capacity
        ('TieredReplayBuffer', 1000000)
        >>> rlaccel_sb3.restore(model)
        >>> type(model.replay_buffer).__name__
        'ReplayBuffer'
    """
    if model in _SWAPS:
        restore(model)
    config = load_config(preset=preset, **overrides)
    if trains().get(type(model).train) is not None:
        refuse_uncompilable(model, config)  # now, not at learn()
    original = getattr(model, "replay_buffer", None)
    swapped = tiered_replay and isinstance(original, ReplayBuffer) and not isinstance(original, TieredBufferMixin)
    if swapped and type(original) not in SWAPPABLE:
        raise ConfigError(
            f"replay_buffer must be one of {[c.__name__ for c in SWAPPABLE]} for accelerate() to swap it, got "
            f"replay_buffer={type(original).__name__}: a tiered buffer would silently drop what it does (e.g. "
            "HER's goal relabelling). Call accelerate(model, ..., tiered_replay=False) to keep your buffer and "
            "use rlaccel's updates only.")
    level_capacity = _explicit_level_capacity(overrides, config)
    for line in hyperparameter_report(model, config, level_capacity if swapped else None):
        logger.info("rlaccel: %s", line)
        if getattr(model, "verbose", 0):
            print(f"rlaccel: {line}")
    added = 0
    if swapped:
        model.replay_buffer = _tiered_copy(model, original, config, preset, level_capacity)
        added = model.replay_buffer.engine.added
    callback = AccelerateCallback(config=config)
    _SWAPS[model] = _Swap(original=original if swapped else None, added_at_swap=added, callbacks=[callback])
    return callback


def restore(model: BaseAlgorithm) -> None:
    """Undo :func:`accelerate`: the original buffer comes back holding every transition collected
    meanwhile that the tiered ring still holds (newest last; if the ring has dropped some, the
    ``rlaccel`` logger says how many), and every parameter's ``requires_grad`` is restored."""
    swap = _SWAPS.pop(model, None)
    if swap is None:
        return
    for callback in swap.callbacks:
        callback.teardown()
    tiered = getattr(model, "replay_buffer", None)
    if swap.original is not None and isinstance(tiered, TieredBufferMixin):
        engine = tiered.engine
        new_rows = (engine.added - swap.added_at_swap) // engine.num_envs
        kept = min(new_rows, engine.stored_rows)
        if kept < new_rows:
            logger.info("rlaccel: restore(): the tiered ring no longer holds the oldest %d of the %d transitions "
                        "collected since accelerate(); copied back the %d it holds", (new_rows - kept) * engine.num_envs,
                        new_rows * engine.num_envs, kept * engine.num_envs)
        _copy_rows(tiered, swap.original, kept)
        model.replay_buffer = swap.original


def hyperparameter_report(model: BaseAlgorithm, config: AccelConfig,
                          level_capacity: tuple[int, ...] | None = None) -> list[str]:
    """Where the model's settings differ from the preset's (never applied to an existing model), and
    the buffer capacity an explicit ``level_capacity`` sets."""
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
    if level_capacity is not None and sum(level_capacity) != model.buffer_size:
        lines.append(f"buffer_size: model has {model.buffer_size!r}, level_capacity={list(level_capacity)} sets the "
                     f"replay buffer's capacity to {sum(level_capacity)} transitions (changed, as you asked)")
    return lines


def _explicit_level_capacity(overrides: dict[str, Any], config: AccelConfig) -> tuple[int, ...] | None:
    """The tiers the caller set explicitly (a preset's tiers are fitted into the model's buffer_size)."""
    section = overrides.get("replay_buffer")
    explicit = "level_capacity" in overrides or (isinstance(section, dict) and "level_capacity" in section)
    return config.replay_buffer.level_capacity if explicit else None


def _tiered_copy(model: BaseAlgorithm, original: ReplayBuffer, config: AccelConfig, preset: str | None,
                 level_capacity: tuple[int, ...] | None) -> TieredBufferMixin:
    cls = TieredDictReplayBuffer if isinstance(original, DictReplayBuffer) else TieredReplayBuffer
    replay = config.replay_buffer
    if level_capacity is None:  # the model's capacity stays: the tiers are sized into it
        replay = tiers_for_capacity(replay, model.buffer_size, model.n_envs, preset=preset)
    n_step = dict(n_steps=original.n_steps, gamma=original.gamma) if isinstance(original, NStepReplayBuffer) else {}
    tiered = cls(model.buffer_size, model.observation_space, model.action_space, device=model.device,
                 n_envs=model.n_envs, optimize_memory_usage=original.optimize_memory_usage,
                 handle_timeout_termination=original.handle_timeout_termination, replay_config=replay, **n_step)
    _copy_rows(original, tiered, original.size())
    return tiered


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
