"""Checkpoint (pickle) size of the tiered replay engine on Pong-shaped data: what is stored vs the ring.

A ``TieredReplay`` with the ``atari`` preset (126,000 transitions, 8 env streams, 4x84x84 uint8
stacks de-duplicated) is filled with ``--steps`` transitions and pickled, as ``rlaccel train``'s
checkpoints and SB3's ``save_replay_buffer`` do. Reported: pickle size, bytes per stored transition,
and what the ring allocates.

Usage:
    python benchmarks/checkpoint_size.py [--steps 2048]
"""

from __future__ import annotations

import argparse
import pickle
import platform

from replay_bench import NUM_ENVS, make_stream  # the same Pong-shaped streams

import rlaccel_plugins as rla


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2048, help="transitions stored (all envs together)")
    args = parser.parse_args()
    buf = rla.TieredReplay.from_config(rla.get_preset("atari"), num_envs=NUM_ENVS, seed=0)
    for transition in make_stream(args.steps // NUM_ENVS, episode=400):
        buf.add(**transition)
    size = len(pickle.dumps(buf, protocol=pickle.HIGHEST_PROTOCOL))
    print(f"{platform.machine()}, {len(buf):,} transitions stored in a {buf.capacity:,}-transition atari ring: "
          f"pickle {size / 1e6:.1f} MB ({size / len(buf):,.0f} B per stored transition); "
          f"the ring allocates {buf.nbytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
