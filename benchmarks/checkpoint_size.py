"""Checkpoint (pickle) size of replay buffers on Pong-shaped data: what each buffer class writes.

The same ``--steps`` Pong-shaped transitions (8 env streams, 4x84x84 uint8 stacks, 6 actions) go into
each buffer, which is then pickled as ``rlaccel train``'s checkpoints, SB3's ``save_replay_buffer`` and
a Tianshou ``pickle.dump`` do (the bytes are counted, not kept). Buffers, at the capacities their
Atari recipes use:

- the core engine, ``TieredReplay`` with the ``atari`` preset (126,000 transitions);
- SB3: the drop-in ``TieredReplayBuffer(100_000, preset="atari")`` and SB3's own ``ReplayBuffer``
  (RL Zoo's Atari DQN: ``buffer_size=100_000``, ``optimize_memory_usage=False``) — what ``--stock`` saves;
- Tianshou: ``VectorReplayBuffer(100_000, 8, stack_num=4, ignore_obs_next=True,
  save_only_last_obs=True)`` as Tianshou's Atari example builds it, and the drop-in
  ``TieredVectorReplayBuffer`` with the same options (Tianshou's storage, pickled as what is stored).

Usage:
    python -m benchmarks.checkpoint_size [--steps 2048] [--out benchmarks/results/checkpoint-size]
"""

from __future__ import annotations

import argparse
import pickle
import platform

import numpy as np

import rlaccel_plugins as rla
from benchmarks import _results
from benchmarks.replay_bench import FRAME, NUM_ENVS, STACK, make_stream  # the same Pong-shaped streams

CAPACITY = 100_000  # RL Zoo's and Tianshou's Atari DQN buffer size
TIANSHOU_DROPIN, TIANSHOU_STOCK = "Tianshou drop-in TieredVectorReplayBuffer", "Tianshou VectorReplayBuffer (--stock)"


class _ByteCounter:
    """A file object that only counts what is written to it."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data) -> int:
        self.written += memoryview(data).nbytes
        return memoryview(data).nbytes


def pickled_bytes(buffer) -> int:
    counter = _ByteCounter()
    pickle.dump(buffer, counter, protocol=pickle.HIGHEST_PROTOCOL)
    return counter.written


def engine(stream: list[dict]):
    buf = rla.TieredReplay.from_config(rla.get_preset("atari"), num_envs=NUM_ENVS, seed=0)
    for t in stream:
        buf.add(**t)
    return buf


def sb3_buffers(stream: list[dict]):
    from gymnasium import spaces
    from rlaccel_sb3 import TieredReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer

    obs_space, act_space = spaces.Box(0, 255, (STACK, *FRAME), np.uint8), spaces.Discrete(6)
    out = {}
    for name, buf in (("SB3 drop-in TieredReplayBuffer", TieredReplayBuffer(
            CAPACITY, obs_space, act_space, device="cpu", n_envs=NUM_ENVS, preset="atari", seed=0)),
                      ("SB3 ReplayBuffer (--stock)", ReplayBuffer(
            CAPACITY, obs_space, act_space, device="cpu", n_envs=NUM_ENVS, optimize_memory_usage=False))):
        for t in stream:
            buf.add(t["obs"], t["next_obs"], t["action"][:, None], t["reward"], t["terminated"],
                    [{} for _ in range(NUM_ENVS)])
        out[name] = buf
    return out


def tianshou_buffers(stream: list[dict]):
    from rlaccel_tianshou import TieredVectorReplayBuffer
    from tianshou.data import Batch, VectorReplayBuffer

    options = dict(stack_num=STACK, ignore_obs_next=True, save_only_last_obs=True)
    out = {}
    for name, buf in ((TIANSHOU_DROPIN, TieredVectorReplayBuffer(
            CAPACITY, NUM_ENVS, preset="atari", **options)),
                      (TIANSHOU_STOCK, VectorReplayBuffer(CAPACITY, NUM_ENVS, **options))):
        for t in stream:
            buf.add(Batch(obs=t["obs"], act=t["action"], rew=t["reward"], terminated=t["terminated"],
                          truncated=t["truncated"], obs_next=t["next_obs"], info=Batch()),
                    buffer_ids=np.arange(NUM_ENVS))
        out[name] = buf
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2048, help="transitions stored (all envs together)")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    stream = make_stream(args.steps // NUM_ENVS, episode=400)
    stored = len(stream) * NUM_ENVS
    buf = engine(stream)
    buffers = {f"core TieredReplay (atari preset, {buf.capacity:,})": buf}
    buffers.update(sb3_buffers(stream))
    buffers.update(tianshou_buffers(stream))
    print(f"{platform.machine()}, {platform.processor() or 'cpu'}: {stored:,} Pong-shaped transitions stored; "
          f"pickle size per buffer (the core engine's ring allocates {buf.nbytes / 1e6:.1f} MB)")
    print(f"{'buffer':<46} {'pickle MB':>10} {'B per stored transition':>24}")
    rows = []
    for name, buffer in buffers.items():
        size = pickled_bytes(buffer)
        print(f"{name:<46} {size / 1e6:>10.1f} {size / stored:>24,.0f}")
        rows.append({"buffer": name, "pickle_mb": size / 1e6, "bytes_per_transition": size / stored})
    mb = {row["buffer"]: row["pickle_mb"] for row in rows}
    _results.write(args.out, "checkpoint_size", rows=rows, transitions=stored,
                   headline=f"Tianshou, {stored:,} Pong transitions: {mb[TIANSHOU_DROPIN]:.1f} MB against "
                            f"{mb[TIANSHOU_STOCK]:.1f} MB")


if __name__ == "__main__":
    main()
