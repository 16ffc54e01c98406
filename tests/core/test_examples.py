"""Every example runs, with a tiny budget (smoke tests), in the test's own process
(``tests.script_helpers.run_script``)."""

import re
from pathlib import Path

import pytest

from tests.script_helpers import run_script

pytestmark = [pytest.mark.needs("stable_baselines3", "tianshou", "envpool"), pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


NUMBER = r"-?\d+(\.\d+)?"


# each example's summary line, with what its budget must have done; tianshou_dqn_cartpole.py runs to 475 in
# tests/learning/test_tianshou_cartpole.py
@pytest.mark.parametrize("script, args, summary", [
    ("sb3_dqn_cartpole.py", ["--steps", "1500"],
     (rf"CartPole-v1 DQN \+ rlaccel: 1500 steps, evaluation {NUMBER} ± {NUMBER}; levels \[15\d\d, 0\]; "
      r"updates \{'full_updates': [1-9]\d*, 'dense_updates': 0")),  # SB3 rounds up to whole rollouts
    ("sb3_sac_pendulum.py", ["--steps", "300"], rf"Pendulum-v1 SAC \+ tiered replay: 300 steps, evaluation {NUMBER}"),
    ("sb3_ppo_cartpole.py", ["--steps", "600"],
     r"CartPole-v1 PPO \+ sparse/dense: 600 steps, .*updates [1-9]\d* full / [1-9]\d* dense"),
    ("sb3_dqn_pong_envpool.py", ["--steps", "400", "--envs", "2", "--learning-starts", "200"],
     r"Pong: 400 steps; [\d,]+ bytes per stored transition; updates \{.*'full_updates': [1-9]"),
    ("tianshou_ppo_cartpole.py", ["--steps", "2048"],
     rf"CartPole-v1 Tianshou PPO \+ sparse/dense: best test mean {NUMBER}; [1-9]\d* full / [1-9]\d* dense"),
    ("tianshou_dqn_pong_envpool.py", ["--steps", "300", "--envs", "2"],
     r"Pong: [1-9]\d* env steps; levels \{'level_fill/L0': .*updates \{.*'full_updates': [1-9]"),
])
def test_example_runs(script, args, summary, tmp_path, monkeypatch, capsys):
    out = run_script(EXAMPLES / script, args, tmp_path, monkeypatch, capsys)
    assert re.search(summary, out), out[-2000:]
