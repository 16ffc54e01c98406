"""The no-argument default follows the learning study's decision table, family by family."""

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from rlaccel_sb3 import TieredDictReplayBuffer, TieredReplayBuffer
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.buffers import ReplayBuffer

import rlaccel_plugins as rla
from rlaccel_plugins.replay.evidence import TIERED_FAMILIES, TIERED_IMAGE_FAMILIES, default_sampling

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
STUDY = RESULTS / "learning" / "stats.json"
STUDIES = (STUDY, RESULTS / "pixels" / "stats.json")  # vector observations; images (a row "... (images)")


class MyDQN(DQN):
    """A user's subclass: it counts as the SB3 class it derives from."""


@pytest.mark.parametrize("algo, env, expected", [(DQN, "CartPole-v1", "tiers"), (MyDQN, "CartPole-v1", "tiers"),
                                                 (SAC, "Pendulum-v1", "uniform"), (TD3, "Pendulum-v1", "uniform")])
def test_a_buffer_built_by_sb3_samples_what_its_family_was_shown_to_gain_from(algo, env, expected):
    model = algo("MlpPolicy", env, replay_buffer_class=TieredReplayBuffer, buffer_size=10_000, seed=0)
    sampled = model.replay_buffer.engine.config.sampled()
    assert sampled["sampling"] == expected
    assert sampled["level_capacity"] == [79, 397, 1587, 7937]  # the levels are kept (and reported) either way


def test_qrdqn_follows_its_own_row_pixels_and_buffers_built_by_hand_sample_uniformly_and_a_choice_wins():
    from sb3_contrib import QRDQN

    qrdqn = QRDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=TieredReplayBuffer, buffer_size=10_000)
    assert qrdqn.replay_buffer.engine.config.sampling == "tiers"  # sb3-contrib's class, found through the frame
    pixels = spaces.Box(0, 255, (84, 84, 4), np.uint8)
    atari_like = TieredReplayBuffer(10_000, pixels, spaces.Discrete(6))
    assert atari_like.engine.config.sampling == "uniform"
    by_hand = TieredReplayBuffer(10_000, spaces.Box(-1, 1, (4,)), spaces.Discrete(2))
    assert by_hand.engine.config.sampling == "uniform"  # no algorithm known: the unmeasured case
    chosen = SAC("MlpPolicy", "Pendulum-v1", replay_buffer_class=TieredReplayBuffer, buffer_size=10_000,
                 replay_buffer_kwargs=dict(sampling="tiers"))
    assert chosen.replay_buffer.engine.config.sampling == "tiers"
    assert isinstance(chosen.replay_buffer, ReplayBuffer)


def test_preset_default_and_no_argument_are_one_thing(monkeypatch):
    plain = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=TieredReplayBuffer, buffer_size=10_000)
    named = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=TieredReplayBuffer, buffer_size=10_000,
                replay_buffer_kwargs=dict(preset="default"))
    monkeypatch.setenv("RLACCEL_PRESET", "default")
    ambient = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=TieredReplayBuffer, buffer_size=10_000)
    assert plain.replay_buffer.engine.config == named.replay_buffer.engine.config == ambient.replay_buffer.engine.config
    assert rla.get_preset("default").replay_buffer.sampling == "auto"


def test_the_default_follows_the_committed_decision_table():
    assert json.loads(STUDY.read_text())["decisions"], "the committed study holds no decision"
    decisions = {}
    for path in (p for p in STUDIES if p.exists()):  # a study still running has no stats yet
        decisions.update(json.loads(path.read_text())["decisions"])
    for family, decision in decisions.items():
        framework, algo, *images = family.split()
        pixels = images == ["(images)"]
        assert default_sampling(framework, algo.lower(), pixels) == decision["sampling"], family
    for images, families in ((False, TIERED_FAMILIES), (True, TIERED_IMAGE_FAMILIES)):
        kept = {tuple(f.split()[:2]) for f, d in decisions.items()
                if f.endswith("(images)") == images and d["sampling"] == "tiers"}
        assert {(fw, algo.upper()) for fw, algo in families} == kept


class _Frames(gym.Env):
    """Random observations of ``space``: all a DQN needs to build its buffer for it."""

    def __init__(self, space: spaces.Space) -> None:
        self.observation_space, self.action_space = space, spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize(("space", "images"), [
    (spaces.Box(0, 255, (84, 84, 4), np.uint8), True), (spaces.Box(0, 1, (10, 10, 4), bool), True),
    (spaces.Dict({"frame": spaces.Box(0, 1, (10, 10, 6), bool), "speed": spaces.Box(-1, 1, (2,))}), True),
    (spaces.Box(0, 1, (40,), bool), False), (spaces.Box(-1, 1, (10, 10, 4), np.float32), False),
], ids=["atari-frames", "minatar-frames", "dict-with-frames", "boolean-vector", "float-grid"])
def test_dqn_on_images_follows_the_images_row_minatars_boolean_frames_included(monkeypatch, space, images):
    """The pixel study decided images apart, on MinAtar's boolean frames: those, SB3's uint8 images and a Dict
    holding either follow the images row; anything else the vector one (made to differ here)."""
    from rlaccel_plugins.replay import evidence

    monkeypatch.setattr(evidence, "TIERED_FAMILIES", frozenset({("sb3", "dqn")}))
    monkeypatch.setattr(evidence, "TIERED_IMAGE_FAMILIES", frozenset())
    dict_obs = isinstance(space, spaces.Dict)
    model = DQN("MultiInputPolicy" if dict_obs else "MlpPolicy", _Frames(space), buffer_size=1_000,
                replay_buffer_class=TieredDictReplayBuffer if dict_obs else TieredReplayBuffer)
    assert model.replay_buffer.engine.config.sampling == ("uniform" if images else "tiers")


def test_a_dict_space_in_the_plain_buffer_says_which_class_takes_it():
    space = spaces.Dict({"frame": spaces.Box(0, 1, (10, 10, 6), bool)})
    with pytest.raises(rla.ConfigError, match="observation_space must not be a Dict for TieredReplayBuffer.*"
                                              "replay_buffer_class=TieredDictReplayBuffer"):
        TieredReplayBuffer(1_000, space, spaces.Discrete(2))
