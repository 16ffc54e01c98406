"""Hostile input: wrong env ids, NaN observations, corrupt buffer states, fuzzed add()/sample().

Each gives a clear error naming what is wrong (never a deep traceback), and nothing on disk is damaged.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlaccel_plugins as rla
from rlaccel_plugins.cli import main
from rlaccel_plugins.errors import ConfigError

DOCUMENTED = (ConfigError, ValueError, TypeError)


@pytest.mark.needs('gymnasium')
def test_a_wrong_env_id_is_named_with_the_closest_ids(tmp_path, capsys):
    assert main(["train", "--env", "CartPol-v1", "--steps", "10", "--no-progress", "--logdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "env must be a registered gymnasium, Atari or envpool task id, got env='CartPol-v1'" in err
    assert "Did you mean 'CartPole-v1'" in err
    assert not list(tmp_path.iterdir())  # nothing written for a run that never started


def test_nan_observations_and_rewards_are_refused_naming_field_and_env():
    buf = rla.TieredReplay(level_capacity=[8], sampling_ratio=[1.0], num_envs=2)
    good = dict(obs=np.zeros((2, 3), np.float32), reward=np.zeros(2, np.float32))
    buf.add(**good)
    with pytest.raises(ConfigError, match=r"obs must hold finite numbers, got NaN/Inf for envs \[1\]"):
        buf.add(obs=np.array([[0, 0, 0], [0, np.nan, 0]], np.float32), reward=np.zeros(2, np.float32))
    with pytest.raises(ConfigError, match=r"reward must hold finite numbers, got NaN/Inf for envs \[0\]"):
        buf.add(obs=np.zeros((2, 3), np.float32), reward=np.array([np.inf, 0], np.float32))
    assert len(buf) == 2  # the refused rows were not stored


def test_sb3_buffer_refuses_a_nan_observation_with_a_clear_error():
    import gymnasium as gym
    from rlaccel_sb3 import TieredReplayBuffer

    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    buf = TieredReplayBuffer(100, space, gym.spaces.Discrete(2), preset="classic_control")
    obs = np.zeros((1, 3), np.float32)
    with pytest.raises(ConfigError, match="must hold finite numbers"):
        buf.add(np.full((1, 3), np.nan, np.float32), obs, np.zeros((1, 1)), np.zeros(1), np.zeros(1), [{}])


@pytest.mark.parametrize("state, fragment", [
    ({}, "state must be a TieredReplay state_dict of version"),
    ("garbage", "state must be a TieredReplay state_dict of version"),
])
def test_corrupt_buffer_states_are_refused(state, fragment):
    buf = rla.TieredReplay(level_capacity=[8], sampling_ratio=[1.0])
    with pytest.raises(ValueError, match=fragment):
        buf.load_state_dict(state)


@pytest.mark.needs('stable_baselines3')
def test_a_corrupt_checkpoint_buffer_is_skipped_and_resume_explains(tmp_path, capsys):
    from rlaccel_plugins.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path / "checkpoints")
    store.save(100, {"replay.pkl": lambda p: p.write_bytes(b"\x80\x05 truncated")})
    (tmp_path / "checkpoints" / "step_000000000100" / "replay.pkl").write_bytes(b"bit rot")
    before = sorted(p.name for p in (tmp_path / "checkpoints").rglob("*"))
    (tmp_path / "spec.json").write_text('{"framework": "sb3", "algo": "dqn", "env_id": "CartPole-v1", "config": {}}')
    assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 2
    assert "found only damaged ones: ['step_000000000100']" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "checkpoints").rglob("*")) == before  # nothing deleted


_arrays = st.one_of(
    st.integers(-3, 3).map(lambda n: np.zeros(n % 3 + 1, np.float32)),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: np.full((2, 2), x, np.float32)),
    st.sampled_from([None, "text", 3, [1, 2], np.zeros((2, 2), np.int64), np.zeros((2, 2), np.float64),
                     np.zeros((3, 2), np.float32), np.zeros((2, 2), np.float32)]),
)


@settings(max_examples=200, deadline=None)
@given(adds=st.lists(st.dictionaries(st.sampled_from(["obs", "reward", "extra"]), _arrays, min_size=0, max_size=3),
                     max_size=6),
       batch=st.one_of(st.integers(-2, 600), st.sampled_from([None, 2.5, "8", True])))
def test_fuzzed_add_and_sample_raise_only_documented_errors(adds, batch):
    buf = rla.TieredReplay(level_capacity=[4, 4], sampling_ratio=[0.5, 0.5], num_envs=2, seed=0)
    for fields in adds:
        try:
            buf.add(**fields)
        except DOCUMENTED:
            pass
    try:
        sample = buf.sample(batch)
    except DOCUMENTED:
        return
    assert len(sample.indices) == batch
    for value in sample.data.values():
        assert not (value.dtype.kind == "f" and not np.isfinite(value).all())  # nothing non-finite got in


@pytest.mark.parametrize("args, fragment", [
    (["--steps", "-5"], "--steps must be a positive integer, got --steps=-5"),
    (["--steps", "0"], "--steps must be a positive integer, got --steps=0"),
    (["--eval-freq", "0"], "--eval-freq must be a positive integer, got --eval-freq=0"),
    (["--eval-freq", "-1"], "--eval-freq must be a positive integer"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--stock", "--preset", "atari"], "--preset must not be given with --stock"),
    (["--framework", "tianshou", "--algo", "ppo"], ("algo must be one of ['dqn'] for --framework tianshou, got "
                                                   "algo='ppo'. Use --framework sb3 for it.")),
    (["--algo", "dqnn"], ("algo must be one of ['a2c', 'ddpg', 'dqn', 'ppo', 'qrdqn', 'sac', 'td3'] for --framework "
                          "sb3, got algo='dqnn'. Did you mean 'dqn'?")),
])
def test_command_line_mistakes_are_one_line_errors(args, fragment, tmp_path, capsys):
    code = main(["train", "--logdir", str(tmp_path / "run"), "--no-progress", *args])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err


def test_an_unknown_algorithm_is_refused_before_any_framework_is_imported(tmp_path):
    import subprocess
    import sys

    check = ("import sys; from rlaccel_plugins.cli import main; "
             "code = main(['train', '--algo', 'dqnn', '--no-progress', '--logdir', 'run']); "
             "heavy = sorted(m for m in ('torch', 'stable_baselines3', 'tianshou', 'gymnasium', 'envpool') if m in sys.modules); "
             "print(code, heavy)")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         check=False)
    assert out.stdout.strip() == "2 []", out.stdout + out.stderr
    assert "Did you mean 'dqn'?" in out.stderr and not (tmp_path / "run").exists()


def test_a_logdir_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "taken").write_text("mine")
    assert main(["train", "--logdir", str(tmp_path / "taken"), "--no-progress"]) == 2
    assert "--logdir must be a directory or a path that does not exist yet" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == "mine"


@pytest.mark.needs("stable_baselines3")
@pytest.mark.parametrize("algo, env, kind", [("dqn", "Pendulum-v1", "continuous"), ("sac", "CartPole-v1", "discrete")])
def test_an_algorithm_that_does_not_fit_the_action_space_is_refused_before_building(algo, env, kind, tmp_path,
                                                                                     capsys):
    assert main(["train", "--algo", algo, "--env", env, "--logdir", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"algo must fit the {kind} actions of {env}" in err and not (tmp_path / "result.json").exists()


def test_a_bug_keeps_its_traceback_and_a_missing_extra_names_it(monkeypatch, capsys):
    from rlaccel_plugins import training

    def broken(spec):
        raise TypeError("a bug deep in training")

    monkeypatch.setattr(training, "run_training", broken)
    with pytest.raises(TypeError, match="a bug deep in training"):  # not dressed up as a user mistake
        main(["train", "--no-progress"])

    def needs_envpool(spec):
        raise ModuleNotFoundError("No module named 'envpool'", name="envpool")

    monkeypatch.setattr(training, "run_training", needs_envpool)
    assert main(["train", "--no-progress"]) == 2
    assert 'pip install "rlaccel-plugins[envpool]"' in capsys.readouterr().err


_values = st.sampled_from([0.0, 1.5, -2.0, np.nan, np.inf, -np.inf, 3e38])


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(_values, min_size=8, max_size=8), _values, st.booleans(), st.booleans(),
                                st.sampled_from(["bool", "float32", "float64"])), min_size=1, max_size=12))
def test_the_sb3_buffers_fast_add_stores_and_refuses_exactly_what_the_general_add_does(steps):
    """A VecEnv's arrays (the stored dtypes) take the tiered buffer's one-pass add; anything it is unsure
    of goes the general way. Both must store the same rows and refuse the same inputs (NaN/Inf)."""
    import gymnasium as gym
    from rlaccel_sb3 import TieredReplayBuffer

    space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    fast, general = (TieredReplayBuffer(64, space, gym.spaces.Discrete(3), n_envs=2, preset="classic_control",
                                        seed=0) for _ in range(2))
    general._add_as_stored = lambda *args: False
    for values, reward, done, truncated, done_dtype in steps:
        obs = np.array(values[:4], np.float32).reshape(2, 2)
        next_obs = np.array(values[4:], np.float32).reshape(2, 2)
        args = (obs, next_obs, np.array([1, 2]), np.array([reward, 0.0], np.float32),
                np.array([done, False], dtype=done_dtype), [{"TimeLimit.truncated": truncated}, {}])
        outcomes = []
        for buffer in (fast, general):
            try:
                buffer.add(*args)
                outcomes.append("stored")
            except ConfigError as error:
                outcomes.append(str(error))
        assert outcomes[0] == outcomes[1]
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        assert np.array_equal(getattr(fast, name), getattr(general, name), equal_nan=True), name
    assert (fast.pos, fast.full) == (general.pos, general.full)
