"""rlaccel for Tianshou 2.0: tiered replay buffers and a sparse/dense algorithm wrapper, drop-in.

Names load lazily, so the ``rlaccel`` entry point (``rlaccel_tianshou.plugin``) registers this
adapter without importing Tianshou.

Examples:
    >>> from rlaccel_tianshou import TieredVectorReplayBuffer
    >>> buffer = TieredVectorReplayBuffer(20_000, 10, preset="classic_control")   # was VectorReplayBuffer(20_000, 10)
"""

from __future__ import annotations

from rlaccel_plugins.lazy import lazy_exports

_LAZY = {
    "MinAtarQNetwork": "rlaccel_tianshou.networks",
    "TieredReplayBuffer": "rlaccel_tianshou.buffers",
    "TieredVectorReplayBuffer": "rlaccel_tianshou.buffers",
    "SparseDenseWrapper": "rlaccel_tianshou.wrapper",
    "SparseDenseOnPolicyWrapper": "rlaccel_tianshou.wrapper",
    "unwrap_state_dict": "rlaccel_tianshou.wrapper",
    "wrap": "rlaccel_tianshou.wrapper",
    "accelerate": "rlaccel_tianshou.acceleration",
    "tiered_buffer_like": "rlaccel_tianshou.acceleration",
    "with_rlaccel": "rlaccel_tianshou.acceleration",
    "TieredCollectorFactory": "rlaccel_tianshou.acceleration",
    "SparseDenseWrapperFactory": "rlaccel_tianshou.acceleration",
    "LeanCollector": "rlaccel_tianshou.collector",
}

__all__ = sorted(_LAZY)  # noqa: PLE0605 - the lazy table is the one list of public names


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
