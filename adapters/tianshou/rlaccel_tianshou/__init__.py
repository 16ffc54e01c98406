"""rlaccel for Tianshou 2.0: tiered replay buffers and a sparse/dense algorithm wrapper, drop-in.

Examples:
    >>> from rlaccel_tianshou import TieredVectorReplayBuffer
    >>> buffer = TieredVectorReplayBuffer(20_000, 10, preset="classic_control")   # was VectorReplayBuffer(20_000, 10)
"""

from __future__ import annotations

from rlaccel_tianshou.accelerate import (
    SparseDenseWrapperFactory,
    TieredCollectorFactory,
    accelerate,
    tiered_buffer_like,
    with_rlaccel,
)
from rlaccel_tianshou.buffers import TieredReplayBuffer, TieredVectorReplayBuffer
from rlaccel_tianshou.wrapper import SparseDenseOnPolicyWrapper, SparseDenseWrapper, unwrap_state_dict, wrap

__all__ = ["SparseDenseOnPolicyWrapper", "SparseDenseWrapper", "SparseDenseWrapperFactory", "TieredCollectorFactory",
           "TieredReplayBuffer", "TieredVectorReplayBuffer", "accelerate", "tiered_buffer_like", "unwrap_state_dict",
           "with_rlaccel", "wrap"]
