"""`rlaccel demo`: stock vs rlaccel SB3 DQN on CartPole-v1, side by side, with plots.

The demo is the ``quick`` bench suite restricted to SB3: stock SB3 DQN with RL Zoo's settings (the
yardstick), the same settings with only the README's drop-in, the agent with rlaccel's recipe, and RL
Zoo's PPO (the fastest stock option) with and without the drop-in.
"""

from __future__ import annotations

from typing import Any


def run_demo(seeds: int = 1, preset: str | None = None, steps: int | None = None, out: str = "demo-results",
             first_seed: int = 0) -> dict[str, Any]:
    """Run the demo; prints each run and the table, writes ``results.json``, ``results.md`` and plots to ``out``."""
    from rlaccel_plugins.bench.runner import run_bench

    return run_bench("quick", seeds=seeds, frameworks=("sb3",), out=out, first_seed=first_seed, steps=steps,
                     preset=preset)
