"""Every example runs, with a tiny budget (smoke tests)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("script, args", [
    ("sb3_dqn_cartpole.py", ["--steps", "1500"]),
    ("sb3_sac_pendulum.py", ["--steps", "300"]),
    ("sb3_ppo_cartpole.py", ["--steps", "600"]),
    ("sb3_dqn_pong_envpool.py", ["--steps", "400", "--envs", "2", "--learning-starts", "200"]),
    ("tianshou_dqn_cartpole.py", ["--steps", "1500"]),
    ("tianshou_ppo_cartpole.py", ["--steps", "2048"]),
    ("tianshou_dqn_pong_envpool.py", ["--steps", "300", "--envs", "2"]),
])
def test_example_runs(script, args, tmp_path):
    run = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip()
