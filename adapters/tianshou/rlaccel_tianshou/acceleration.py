"""`accelerate(algorithm)` and the high-level API factories for Tianshou 2.0."""

from __future__ import annotations

from typing import Any

from tianshou.data import Collector, ReplayBuffer, ReplayBufferManager
from tianshou.highlevel.params.algorithm_wrapper import AlgorithmWrapperFactory
from tianshou.highlevel.params.collector import CollectorFactory

from rlaccel_plugins.config import load_config
from rlaccel_tianshou.buffers import TieredReplayBuffer, TieredVectorReplayBuffer
from rlaccel_tianshou.wrapper import wrap


def accelerate(algorithm: Any, preset: str | None = None, **overrides: Any):
    """Wrap a Tianshou algorithm with sparse/dense updates; returns the wrapper to train instead.

    Use :func:`tiered_buffer_like` for the collector's buffer. Hyper-parameters of the algorithm are
    not changed.

    Examples:
        >>> # algorithm = rlaccel_tianshou.accelerate(DQN(policy=..., optim=...), preset="atari")
    """
    config = load_config(preset=preset, **overrides)
    return wrap(algorithm, config=config)


def tiered_buffer_like(buffer: ReplayBuffer, preset: str | None = None, **tiers: Any) -> ReplayBuffer:
    """An empty tiered buffer with ``buffer``'s size, sub-buffer count and options
    (``stack_num``, ``save_only_last_obs``, ``ignore_obs_next``, ``sample_avail``)."""
    options = dict(buffer.options)
    if isinstance(buffer, ReplayBufferManager):
        return TieredVectorReplayBuffer(buffer.maxsize, buffer.buffer_num, preset=preset, **tiers, **options)
    return TieredReplayBuffer(buffer.maxsize, preset=preset, **tiers, **options)


class TieredCollectorFactory(CollectorFactory):
    """High-level API: collectors whose replay buffer is tiered (same size and options as configured).

    ``ExperimentBuilder(...).with_collector_factory(TieredCollectorFactory("classic_control"))``
    """

    def __init__(self, preset: str | None = None, **tiers: Any) -> None:
        self.preset, self.tiers = preset, tiers

    def create_collector(self, algorithm, vector_env, buffer=None, exploration_noise: bool = False):
        if buffer is not None:
            buffer = tiered_buffer_like(buffer, self.preset, **self.tiers)
        return Collector(algorithm, vector_env, buffer, exploration_noise=exploration_noise)


class SparseDenseWrapperFactory(AlgorithmWrapperFactory):
    """High-level API: wrap the built algorithm with :class:`SparseDenseWrapper`.

    ``ExperimentBuilder(...).with_algorithm_wrapper_factory(SparseDenseWrapperFactory("atari"))``
    """

    def __init__(self, preset: str | None = None, **overrides: Any) -> None:
        self.preset, self.overrides = preset, overrides

    def create_wrapped_algorithm(self, algorithm, envs, optim_factory_default, device):
        return accelerate(algorithm, preset=self.preset, **self.overrides)


def with_rlaccel(builder: Any, preset: str | None = None, *, tiered_replay: bool = True, sparse: bool = True):
    """Switch an existing high-level Tianshou experiment builder to rlaccel with one call.

    Examples:
        >>> # experiment = with_rlaccel(DQNExperimentBuilder(env_factory, config, ...), "classic_control").build()
    """
    if tiered_replay:
        builder = builder.with_collector_factory(TieredCollectorFactory(preset))
    if sparse:
        builder = builder.with_algorithm_wrapper_factory(SparseDenseWrapperFactory(preset))
    return builder
