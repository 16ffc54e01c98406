"""Tianshou DQN with the adapter reaches CartPole-v1's 475 threshold within 100k env steps (seeded), run as
a user runs it: the example's command line (which is also that example's smoke test)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tianshou_dqn_cartpole.py"
NUM_ENVS = 10  # the example's


@pytest.mark.slow
@pytest.mark.needs("tianshou")
def test_tianshou_dqn_with_the_tiered_buffer_reaches_475_within_100k_steps(tmp_path):
    run = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "100000", "--seed", "0"], capture_output=True,
                         text=True, timeout=900, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = re.search(r"CartPole-v1 Tianshou DQN \+ tiered replay: best test mean (-?[\d.]+) after (\d+) env steps",
                        run.stdout)
    assert summary, run.stdout[-2000:]
    best, steps = float(summary[1]), int(summary[2])
    assert best >= 475, (best, steps)
    assert steps <= 100_000 + 10 * NUM_ENVS
