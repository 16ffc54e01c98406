"""`SparseDenseWrapper`: Tianshou 2.0 algorithm wrappers that run the sparse/dense schedule.

Built in Tianshou's own wrapper style (`OffPolicyWrapperAlgorithm` / `OnPolicyWrapperAlgorithm`),
with the three things Tianshou's wrapper base gets wrong fixed: the wrapped algorithm's LR
schedulers are stepped, ``state_dict()`` loads back (and a checkpoint of the *unwrapped*
algorithm loads into the wrapper, and vice versa with :func:`unwrap_state_dict`), and attribute
access falls through to the wrapped algorithm (``wrapper.optim``, ``wrapper.model_old`` …).

The core updater hooks each of the wrapped algorithm's optimizers (``_optimizers``; not SAC's
``AutoAlpha``, not NPG/TRPO's natural-gradient actor), so the schedule counts real optimizer steps
for off-policy and on-policy (many minibatch steps per update) algorithms alike. Layers are
traced lazily on the first training batch, so no example input is needed.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any

import torch
from tianshou.algorithm.algorithm_base import (
    OffPolicyAlgorithm,
    OffPolicyWrapperAlgorithm,
    OnPolicyAlgorithm,
    OnPolicyWrapperAlgorithm,
    TrainingStats,
    TrainingStatsWrapper,
)

from rlaccel_plugins.config import AUTO, AccelConfig
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.fused.memory_format import ChannelsLast
from rlaccel_plugins.loader import load_config
from rlaccel_plugins.metrics import collect_metrics
from rlaccel_plugins.threads import ThreadPolicy
from rlaccel_plugins.updates import SparseDenseUpdater
from rlaccel_plugins.updates.guard import GradientGuard
from rlaccel_plugins.updates.precision import update_autocast
from rlaccel_tianshou.kernel_cache import cache_tianshou_kernels

cache_tianshou_kernels()  # before anything here compiles Tianshou's numba kernels

RLACCEL_STATE_KEY = "_rlaccel"
RLACCEL_GUARD_KEY = "_rlaccel_guard"  # the gradient guard's counters and fp16 loss scale
TRACE_BATCH = 8


class SparseDenseStats(TrainingStatsWrapper):
    """The wrapped algorithm's stats plus rlaccel's counters (logged by Tianshou's logger)."""

    def __init__(self, wrapped_stats: TrainingStats, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            setattr(self, key.replace("rlaccel/", "rlaccel_").replace("/", "_"), float(value))
        super().__init__(wrapped_stats)


def unwrap_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A wrapper checkpoint as the unwrapped algorithm's ``state_dict`` (drops rlaccel's entry)."""
    return {k: v for k, v in state_dict.items() if k not in (RLACCEL_STATE_KEY, RLACCEL_GUARD_KEY)}


class _SparseDenseMixin:
    """Shared by the off- and on-policy wrappers."""

    wrapped_algorithm: Any

    def _init_sparse_dense(self, config: AccelConfig, sparse: bool) -> None:
        self.rlaccel_config = config
        self.updater = SparseDenseUpdater.from_config(config, whole_network="info") if sparse else None
        device = next(self.wrapped_algorithm.parameters()).device
        self.guard = GradientGuard.from_config(config, str(device))
        self.lr_schedulers = self.wrapped_algorithm.lr_schedulers  # shared: stepped once per update
        self._last_buffer = None
        self._fused_update = _fused_update(self.wrapped_algorithm, config)
        self._compile = _compiles(self.wrapped_algorithm, config, self._fused_update)
        self._compiled_of = None  # made on the first update (a process's compiled code does not pickle)
        self.compiled = False  # whether the last update's gradient step ran compiled (compiled_step() sets it)
        # training.channels_last: the algorithm's convolutions in channels-last until detach()
        self._channels_last = ChannelsLast([self.wrapped_algorithm], [
            optimizer._optim for optimizer in self.wrapped_algorithm._optimizers]) if config.training.channels_last else None
        threads = config.training.num_threads
        # training.num_threads: torch's threads kept to the cores other processes leave, from the first update
        # until detach() (rlaccel_plugins.threads)
        self.threads = ThreadPolicy(fixed=None if threads == AUTO else int(threads))

    @property
    def fused(self) -> bool:
        """Whether updates run fused (``training.fused_updates``; see ``rlaccel_tianshou.fused``)."""
        return self._fused_update is not None

    def compiled_step(self):
        """The compiled gradient step the fused update runs now (``training.compiled_updates``), or None:
        eager (not asked for, autocast on, the compiler failed, or a dense step of the sparse/dense schedule
        freezes a layer); sets :attr:`compiled`."""
        from rlaccel_tianshou.fused import compiled_steps_for

        if self._compile and self._compiled_of is None:
            self._compiled_of = compiled_steps_for(self.wrapped_algorithm)
        step = self._compiled_of() if self._compiled_of is not None else None
        self.compiled = step is not None and all(p.requires_grad for p in step.parameters)
        return step if self.compiled else None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_compiled_of": None}

    def _threads_in_force(self) -> None:
        """Before an update: the thread policy started on the first, read again (once a second) after."""
        if self.threads.threads is None:
            self.threads.start()
        else:
            self.threads.update()

    # ---------------------------------------------------------------- attaching on the first batch
    def _ensure_attached(self, batch: Any) -> None:
        if self.guard is not None:  # attach() is idempotent
            for optimizer in self.wrapped_algorithm._optimizers:
                self.guard.attach(optimizer._optim)
        if self.updater is None or self.updater.attachments:
            return
        obs = _head(batch.obs)
        act = _head(batch.act) if hasattr(batch, "act") else None
        for i, optimizer in enumerate(self.wrapped_algorithm._optimizers):
            module = optimizer._module
            self.updater.attach(module, optimizer._optim, forward_fn=_forward_fn(module, obs, act),
                                name=f"{type(module).__name__}[{i}]")

    def _autocast(self):
        """The update path under ``precision.dtype`` (autocast, with loss scaling for fp16; fp32: nothing)."""
        from rlaccel_tianshou.fused import first_parameter

        if self.rlaccel_config.precision.dtype == "fp32":
            return contextlib.nullcontext()
        device = first_parameter(self.wrapped_algorithm).device
        trained = [optimizer._module for optimizer in self.wrapped_algorithm._optimizers]
        return update_autocast(self.rlaccel_config.precision.dtype, str(device), self.guard, fp32_outputs_of=trained)

    def _preprocess_batch(self, batch, buffer, indices):
        self._last_buffer = buffer
        return self.wrapped_algorithm._preprocess_batch(batch, buffer, indices)

    def _stats(self, stats: TrainingStats) -> TrainingStats:
        tiered = callable(getattr(self._last_buffer, "stats", None))  # our buffers report their levels
        return SparseDenseStats(stats, collect_metrics(updater=self.updater, guard=self.guard,
                                                       replay=self._last_buffer if tiered else None))

    # ---------------------------------------------------------------- state
    def state_dict(self, *args, **kwargs):
        state = self.wrapped_algorithm.state_dict(*args, **kwargs)
        if self.updater is not None:
            state[RLACCEL_STATE_KEY] = self.updater.state_dict()
        if self.guard is not None:
            state[RLACCEL_GUARD_KEY] = self.guard.state_dict()
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        state = dict(state_dict)
        rlaccel_state = state.pop(RLACCEL_STATE_KEY, None)
        guard_state = state.pop(RLACCEL_GUARD_KEY, None)
        prefix = "wrapped_algorithm."
        if any(k.startswith(prefix) for k in state):  # a checkpoint of Tianshou's own wrapper style
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        result = self.wrapped_algorithm.load_state_dict(state, strict=strict, assign=assign)
        if rlaccel_state is not None and self.updater is not None:
            self.updater.load_state_dict(rlaccel_state)
        if guard_state is not None and self.guard is not None:
            self.guard.load_state_dict(guard_state)
        return result

    def detach(self) -> None:
        """Restore every parameter's ``requires_grad``, remove the hooks, put ``training.channels_last``'s
        convolutions back in PyTorch's default format and torch's thread count back to what it was."""
        self.threads.stop()
        if self.updater is not None:
            self.updater.detach()
        if self.guard is not None:
            self.guard.detach()
        if self._channels_last is not None:
            self._channels_last.remove()
            self._channels_last = None

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            wrapped = self.__dict__.get("_modules", {}).get("wrapped_algorithm")
            if wrapped is None:
                raise
            return getattr(wrapped, name)


class SparseDenseWrapper(_SparseDenseMixin, OffPolicyWrapperAlgorithm):
    """Wrap an off-policy Tianshou algorithm (DQN, DDPG, TD3, SAC, …) with sparse/dense updates.

    Args:
        wrapped_algorithm: the algorithm to wrap.
        preset: the preset whose ``training`` block gives the schedule; ``sparse_update_interval`` and
            ``dense_layers`` override it.
        sparse: ``False`` keeps every update full (stats only).

    Examples:
        >>> import gymnasium as gym
        >>> from tianshou.algorithm import DQN
        >>> from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
        >>> from tianshou.algorithm.optim import AdamOptimizerFactory
        >>> from tianshou.utils.net.common import Net
        >>> policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[16]),
        ...                                  action_space=gym.spaces.Discrete(2))
        >>> algorithm = SparseDenseWrapper(DQN(policy=policy, optim=AdamOptimizerFactory()), preset="atari")
        >>> algorithm.gamma, algorithm.rlaccel_config.training.sparse_update_interval  # falls through; every update full
        (0.99, 1)
    """

    def __init__(self, wrapped_algorithm: OffPolicyAlgorithm, preset: str | None = None, *,
                 sparse_update_interval: int | None = None, dense_layers: list | None = None,
                 sparse: bool = True, config: AccelConfig | None = None) -> None:
        super().__init__(wrapped_algorithm)
        self._init_sparse_dense(_config(config, preset, sparse_update_interval, dense_layers), sparse)

    def update(self, buffer, sample_size):
        from rlaccel_tianshou.fused import fusable_buffer

        self._threads_in_force()
        if self._fused_update is not None and fusable_buffer(buffer):
            return self._fused_update(self, buffer, sample_size)
        return super().update(buffer, sample_size)

    def _update_with_batch(self, batch):
        self._ensure_attached(batch)
        with self._autocast():
            return self._stats(self.wrapped_algorithm._update_with_batch(batch))

    # abstract in Tianshou's wrapper base, so it must exist; never called, since _update_with_batch
    # above replaces the base's (it attaches and enters autocast before the wrapped update)
    def _wrapper_update_with_batch(self, batch, original_stats):
        return original_stats


class SparseDenseOnPolicyWrapper(_SparseDenseMixin, OnPolicyWrapperAlgorithm):
    """The on-policy counterpart of :class:`SparseDenseWrapper` (PPO, A2C, …): every minibatch
    optimizer step inside an update follows the schedule."""

    def __init__(self, wrapped_algorithm: OnPolicyAlgorithm, preset: str | None = None, *,
                 sparse_update_interval: int | None = None, dense_layers: list | None = None,
                 sparse: bool = True, config: AccelConfig | None = None) -> None:
        super().__init__(wrapped_algorithm)
        self._init_sparse_dense(_config(config, preset, sparse_update_interval, dense_layers), sparse)

    def update(self, buffer, batch_size, repeat):
        from rlaccel_tianshou.fused import fusable_buffer

        self._threads_in_force()
        if self._fused_update is not None and fusable_buffer(buffer):
            return self._fused_update(self, buffer, batch_size, repeat)
        return super().update(buffer, batch_size, repeat)

    def _update_with_batch(self, batch, batch_size, repeat):
        self._ensure_attached(batch)
        with self._autocast():
            stats = self.wrapped_algorithm._update_with_batch(batch, batch_size=batch_size, repeat=repeat)
        return self._stats(stats)

    # abstract in Tianshou's wrapper base; never called (see SparseDenseWrapper)
    def _wrapper_update_with_batch(self, batch, batch_size, repeat, original_stats):
        return original_stats


def wrap(algorithm: Any, **kwargs: Any):
    """The right wrapper for ``algorithm`` (off-policy or on-policy)."""
    if isinstance(algorithm, OnPolicyAlgorithm):
        return SparseDenseOnPolicyWrapper(algorithm, **kwargs)
    if isinstance(algorithm, OffPolicyAlgorithm):
        return SparseDenseWrapper(algorithm, **kwargs)
    raise ConfigError(f"algorithm must be a Tianshou on- or off-policy algorithm, got {type(algorithm).__name__}. "
                    "Offline algorithms are not supported.")


def _fused_update(algorithm, config: AccelConfig):
    """The fused update ``training.fused_updates`` asks for (None: Tianshou's own). In fp32 only: under
    bf16/fp16 the wrapper's autocast casts the outputs of the optimizers' modules (e.g. DQN's policy) to
    fp32 for the loss, and the fused update calls the networks inside them."""
    from rlaccel_plugins.fused.selection import select_fused
    from rlaccel_plugins.updates.precision import resolve_dtype
    from rlaccel_tianshou.fused import SUPPORTED, first_parameter, fused_update_for
    from rlaccel_tianshou.verified import CODE, update_key

    setting, fused = config.training.fused_updates, fused_update_for(algorithm)
    dtype = config.precision.dtype
    if fused is not None and setting is not False \
            and resolve_dtype(dtype, str(first_parameter(algorithm).device)) != "fp32":
        if setting is True:
            raise ConfigError(f"fused_updates=true runs Tianshou's fused updates in fp32 only, got dtype={dtype!r}. "
                              "Fix: fused_updates=auto (Tianshou's own update under autocast) or dtype=fp32.")
        logging.getLogger("rlaccel").info("rlaccel: Tianshou's fused updates run in fp32 only; with dtype=%s "
                                          "Tianshou's own update runs under autocast", dtype)
        return None
    return select_fused(setting, fused, algorithm=type(algorithm).__name__, framework="Tianshou",
                        supported=SUPPORTED,
                        unverified=CODE.unverified(update_key(algorithm)) if fused is not None else None)


def _compiles(algorithm, config: AccelConfig, fused_update) -> bool:
    """Whether the gradient steps run compiled: where ``training.compiled_updates: true`` asks (``auto`` keeps
    Tianshou's updates eager: their compiled steps have had no learning check); a clear error where they cannot."""
    from rlaccel_tianshou.fused import compiled_unavailable

    if config.training.compiled_updates is not True:
        return False
    reason = "the fused update is off" if fused_update is None else compiled_unavailable(algorithm)
    if reason is not None:
        raise ConfigError(f"compiled_updates=true needs a compiled gradient step, got {type(algorithm).__name__}: "
                          f"{reason}. Fix: compiled_updates=auto.")
    return True


def _config(config: AccelConfig | None, preset: str | None, interval: int | None, dense_layers) -> AccelConfig:
    overrides = {k: v for k, v in dict(sparse_update_interval=interval, dense_layers=dense_layers).items()
                 if v is not None}
    return load_config(config, preset=preset, **overrides)


def _head(value: Any) -> Any:
    """The first few rows of a batch field (numpy, tensor or nested Batch)."""
    try:
        return value[:TRACE_BATCH]
    except (TypeError, IndexError):
        return value


def _forward_fn(module: torch.nn.Module, obs: Any, act: Any):
    """How to run ``module``'s real forward on example data, for the layer trace."""
    if hasattr(module, "actor") and hasattr(module, "critic") and not _has_own_forward(module):  # ActorCritic
        return lambda m: (m.actor(obs), m.critic(obs))
    inner = getattr(module, "model", None)
    if isinstance(inner, torch.nn.Module) and _is_policy(module):  # DQN family: the Q-network
        return lambda m: inner(obs)
    if _is_policy(module) and isinstance(getattr(module, "actor", None), torch.nn.Module):
        return lambda m: m.actor(obs)
    params = inspect.signature(module.forward).parameters
    if "act" in params and act is not None:  # continuous critics: Q(s, a)
        act_tensor = torch.as_tensor(act, dtype=torch.float32)
        return lambda m: m(obs, act_tensor)
    return lambda m: m(obs)


def _is_policy(module: torch.nn.Module) -> bool:
    from tianshou.algorithm.algorithm_base import Policy

    return isinstance(module, Policy)


def _has_own_forward(module: torch.nn.Module) -> bool:
    return type(module).forward is not torch.nn.Module.forward
