"""`accelerate(algorithm)` and the high-level API factories for Tianshou 2.0."""

from __future__ import annotations

import copy
from typing import Any

from tianshou.data import ReplayBuffer, ReplayBufferManager, VectorReplayBuffer
from tianshou.highlevel.params.algorithm_wrapper import AlgorithmWrapperFactory
from tianshou.highlevel.params.collector import CollectorFactory

from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.loader import load_config
from rlaccel_tianshou.buffers import TieredReplayBuffer, TieredVectorReplayBuffer
from rlaccel_tianshou.wrapper import _SparseDenseMixin, wrap

# buffers whose every behaviour the tiered ones keep (they share Tianshou's storage and options)
CONVERTIBLE = (ReplayBuffer, VectorReplayBuffer, TieredReplayBuffer, TieredVectorReplayBuffer)
# the bookkeeping a buffer (and each sub-buffer) keeps beside its storage
_COUNTERS = ("_insertion_idx", "_size", "_ep_return", "_ep_len", "_ep_start_idx", "last_index", "_lengths")


def accelerate(algorithm: Any, preset: str | None = None, **overrides: Any):
    """Wrap a Tianshou algorithm with sparse/dense updates; returns the wrapper to train instead.

    Use :func:`tiered_buffer_like` for the collector's buffer. Hyper-parameters of the algorithm are
    not changed. Given an algorithm it has already wrapped, it detaches that wrapper (every flag
    restored) and wraps the algorithm inside with the new settings, so it never wraps twice.

    Examples:
        >>> import gymnasium as gym
        >>> from tianshou.algorithm import DQN
        >>> from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
        >>> from tianshou.algorithm.optim import AdamOptimizerFactory
        >>> from tianshou.utils.net.common import Net
        >>> policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[16]),
        ...                                  action_space=gym.spaces.Discrete(2))
        >>> algorithm = accelerate(DQN(policy=policy, optim=AdamOptimizerFactory()), preset="atari",
        ...                        sparse_update_interval=100)  # the article's schedule; the default: every update full
        >>> type(algorithm).__name__, algorithm.updater.schedule.interval
        ('SparseDenseWrapper', 100)
        >>> accelerate(algorithm, preset="classic_control").wrapped_algorithm is algorithm.wrapped_algorithm
        True
    """
    config = load_config(preset=preset, **overrides)
    if isinstance(algorithm, _SparseDenseMixin):
        algorithm.detach()
        algorithm = algorithm.wrapped_algorithm
    return wrap(algorithm, config=config)


def tiered_buffer_like(buffer: ReplayBuffer, preset: str | None = None, **tiers: Any) -> ReplayBuffer:
    """A tiered buffer with ``buffer``'s size, sub-buffer count, options (``stack_num``,
    ``save_only_last_obs``, ``ignore_obs_next``, ``sample_avail``) and data.

    Every stored transition is kept, with the episode bookkeeping, so collection goes on where it
    was. Buffers with behaviour of their own (prioritized, HER, cached) are refused with a
    ``ConfigError``, as is an explicit ``level_capacity`` of another size than a non-empty buffer's.

    Examples:
        >>> from tianshou.data import Batch, VectorReplayBuffer
        >>> buf = VectorReplayBuffer(400, 4)
        >>> for t in range(20):
        ...     _ = buf.add(Batch(obs=[[t]] * 4, act=[0] * 4, rew=[1.0] * 4, terminated=[False] * 4,
        ...                       truncated=[False] * 4, obs_next=[[t + 1]] * 4, info=[{}] * 4))
        >>> tiered = tiered_buffer_like(buf, "classic_control")
        >>> type(tiered).__name__, tiered.maxsize, len(tiered), tiered.buffer_num
        ('TieredVectorReplayBuffer', 400, 80, 4)
    """
    if type(buffer) not in CONVERTIBLE:
        raise ConfigError(
            f"buffer must be one of {[c.__name__ for c in CONVERTIBLE]} to convert, got buffer="
            f"{type(buffer).__name__}: a tiered buffer would silently drop what it does (prioritisation, goal "
            "relabelling, caching). Keep that buffer, or build a TieredVectorReplayBuffer yourself.")
    options = dict(buffer.options)
    if isinstance(buffer, ReplayBufferManager):
        tiered = TieredVectorReplayBuffer(buffer.maxsize, buffer.buffer_num, preset=preset, **tiers, **options)
    else:
        tiered = TieredReplayBuffer(buffer.maxsize, preset=preset, **tiers, **options)
    if len(buffer):
        if tiered.maxsize != buffer.maxsize:
            raise ConfigError(f"level_capacity must keep the buffer's size to convert a buffer holding data, got "
                              f"level_capacity={tiers.get('level_capacity')} ({tiered.maxsize} transitions) for a "
                              f"buffer of {buffer.maxsize}. Drop level_capacity (a preset keeps the size).")
        _copy_contents(buffer, tiered)
    return tiered


def _copy_contents(source: ReplayBuffer, target: ReplayBuffer) -> None:
    """Copy the storage and bookkeeping of ``source`` into ``target`` of the same layout."""
    target._meta = copy.deepcopy(source._meta)
    pairs = [(source, target)]
    if isinstance(source, ReplayBufferManager):
        pairs += list(zip(source.buffers, target.buffers, strict=True))
        target._set_batch_for_children()
    for src, dst in pairs:
        for name in _COUNTERS:
            if hasattr(src, name):
                setattr(dst, name, copy.deepcopy(getattr(src, name)))
    target.added = len(source)


class TieredCollectorFactory(CollectorFactory):
    r"""High-level API: :class:`~rlaccel_tianshou.collector.LeanCollector`\ s whose replay buffer is tiered
    (same size and options as configured).

    ``ExperimentBuilder(...).with_collector_factory(TieredCollectorFactory("classic_control"))``
    """

    def __init__(self, preset: str | None = None, **tiers: Any) -> None:
        self.preset, self.tiers = preset, tiers

    def create_collector(self, algorithm, vector_env, buffer=None, exploration_noise: bool = False):
        from rlaccel_tianshou.collector import LeanCollector

        if buffer is not None:
            buffer = tiered_buffer_like(buffer, self.preset, **self.tiers)
        return LeanCollector(algorithm, vector_env, buffer, exploration_noise=exploration_noise)


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

    Example (``tests/tianshou/test_tianshou_adapter.py`` runs a whole experiment)::

        experiment = with_rlaccel(DQNExperimentBuilder(env_factory, config, ...), "classic_control").build()
    """
    if tiered_replay:
        builder = builder.with_collector_factory(TieredCollectorFactory(preset))
    if sparse:
        builder = builder.with_algorithm_wrapper_factory(SparseDenseWrapperFactory(preset))
    return builder
