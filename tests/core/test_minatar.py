"""MinAtar as a task family: its games train from the CLI on both frameworks with the paper's network (the
SB3 drop-in on the paper's DQN recipe), and a machine without the GPL-licensed ``minatar`` package is told
which extra installs it."""

from __future__ import annotations

import json

import pytest
import torch

from rlaccel_plugins.cli import main

pytestmark = pytest.mark.needs("minatar")


def _conv_layers(module: torch.nn.Module) -> list[tuple[int, int, tuple[int, int]]]:
    return [(m.in_channels, m.out_channels, m.kernel_size) for m in module.modules() if isinstance(m, torch.nn.Conv2d)]


def test_the_sb3_drop_in_trains_a_minatar_game_with_the_papers_recipe(tmp_path, capsys):
    from stable_baselines3 import DQN

    args = ["train", "--env", "MinAtar/Breakout-v1", "--drop-in", "--steps", "1200", "--eval-freq", "600",
            "--no-progress", "--logdir", str(tmp_path), "--hp", "learning_starts=400"]  # the recipe's 5,000: too long
    assert main(args) == 0
    assert "trained 1,200 env steps" in capsys.readouterr().out  # MinAtar has no solved return to report
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["env_steps"] == 1200 and len(result["curve"]) == 2
    model = DQN.load(tmp_path / "model.zip")
    assert model.observation_space.shape == (10, 10, 4) and model.observation_space.dtype == bool
    assert _conv_layers(model.q_net) == [(4, 16, (3, 3))]  # the paper's network: one 3x3 conv of 16 channels,
    assert [m.out_features for m in model.q_net.modules() if isinstance(m, torch.nn.Linear)] == [128, 3]  # 128, head
    assert isinstance(model.policy.optimizer, torch.optim.RMSprop) and model.policy.optimizer.defaults["centered"]
    assert model._n_updates == 1200 - 400  # one gradient step per env step after the warm-up
    assert type(model.replay_buffer).__name__ == "TieredReplayBuffer"


def test_tianshou_trains_a_minatar_game_with_the_papers_network(tmp_path):
    from rlaccel_tianshou import MinAtarQNetwork

    args = ["train", "--framework", "tianshou", "--env", "MinAtar/Asterix-v1", "--steps", "1000", "--eval-freq",
            "1000", "--no-progress", "--logdir", str(tmp_path)]
    assert main(args) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["env_steps"] >= 1000 and result["gradient_steps"] > 0
    state = torch.load(tmp_path / "algorithm.pt", weights_only=False)
    net = MinAtarQNetwork((10, 10, 4), 5)
    net.load_state_dict({k.removeprefix("policy.model."): v for k, v in state.items() if k.startswith("policy.model.")})
    assert _conv_layers(net) == [(4, 16, (3, 3))]


def test_without_the_minatar_package_the_error_names_the_extra(monkeypatch, tmp_path, capsys):
    import sys

    import gymnasium as gym

    for env_id in [e for e in gym.registry if e.startswith("MinAtar/")]:  # as on a machine that never had it
        monkeypatch.delitem(gym.registry, env_id)
    monkeypatch.setitem(sys.modules, "minatar", None)
    monkeypatch.setitem(sys.modules, "minatar.gym", None)
    assert main(["train", "--env", "MinAtar/Breakout-v1", "--steps", "100", "--no-progress",
                 "--logdir", str(tmp_path)]) == 2
    assert 'minatar must be installed for this, got it missing. Fix: pip install "rlaccel-plugins[minatar]"' \
        in capsys.readouterr().err
