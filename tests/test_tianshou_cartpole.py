"""Tianshou DQN with the adapter reaches CartPole-v1's 475 threshold within 100k env steps (seeded)."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tianshou_dqn_cartpole.py"


@pytest.mark.slow
def test_tianshou_dqn_with_the_tiered_buffer_reaches_475_within_100k_steps():
    spec = importlib.util.spec_from_file_location("tianshou_dqn_cartpole", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    best, steps, _ = example.train(seed=0, max_steps=100_000)
    assert best >= 475, (best, steps)
    assert steps <= 100_000 + 10 * example.NUM_ENVS
