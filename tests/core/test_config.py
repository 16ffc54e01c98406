import math
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlaccel_plugins as rla
from rlaccel_plugins.config import FIELD_SECTION, SECTIONS
from rlaccel_plugins.errors import ConfigError


def test_atari_preset_holds_the_article_values_but_its_schedule_which_is_one_setting_away():
    from rlaccel_plugins.presets import ARTICLE_SCHEDULE

    cfg = rla.get_preset("atari")
    assert cfg.replay_buffer.levels == 4
    assert cfg.replay_buffer.level_capacity == (1000, 5000, 20000, 100000)
    assert cfg.replay_buffer.sampling_ratio == (0.7, 0.2, 0.08, 0.02)
    assert cfg.replay_buffer.sampling == "auto"  # its tiers where the pixel study confirmed them (SB3 DQN)
    t = cfg.training
    assert (t.batch_size, t.sparse_update_interval, t.dense_layers) == (512, 1, (-3, -2, -1))  # the pixel study
    assert (t.learning_rate, t.parallel_envs, t.sync_interval) == (0.00025, 256, 50)
    article = rla.load_config(preset="atari", **ARTICLE_SCHEDULE).training
    assert (article.sparse_update_interval, article.dense_layers) == (100, (-3, -2, -1))


def test_task_type_presets_follow_the_tuning_table():
    assert rla.get_preset("mujoco").training.batch_size == 1024
    assert rla.get_preset("multi_agent").replay_buffer.level_capacity[0] == 2000
    ratios = rla.get_preset("sparse_reward").replay_buffer.sampling_ratio
    assert ratios[0] == 0.8 and math.isclose(sum(ratios), 1.0)
    # the other levels keep their relative weights
    assert math.isclose(ratios[1] / ratios[2], 0.2 / 0.08)
    off = rla.get_preset("off")
    assert off.replay_buffer.levels == 1 and off.training.sparse_update_interval == 1
    assert set(rla.preset_names()) >= {"atari", "mujoco", "multi_agent", "sparse_reward", "classic_control", "off"}


@pytest.mark.parametrize("values, fragment", [
    ({"batch_size": "64"}, "batch_size must be an integer, got batch_size='64'"),
    ({"batch_size": 0}, "batch_size must be >= 1, got batch_size=0"),
    ({"sampling_ratio": [0.7, 0.2, 0.08]}, "sampling_ratio must have one entry per level (levels=4)"),
    ({"replay_buffer": {"levels": 2, "level_capacity": [10, 20], "sampling_ratio": [0.7, 0.2]}},
     "sampling_ratio must sum to 1, got sampling_ratio=[0.7, 0.2]"),
    ({"level_capacity": [1000, -5, 20000, 100000]}, "level_capacity must be a list of positive integers"),
    ({"levels": 3}, "level_capacity must have one entry per level (levels=3)"),
    ({"learning_rate": float("nan")}, "learning_rate must be a finite number"),
    ({"dense_layers": [0, 1]}, "dense_layers must hold negative layer indices"),
    ({"precision": "fp8"}, "dtype must be one of"),
    ({"fused_optimizer": "auto"}, "fused_optimizer must be true or false, got fused_optimizer='auto'"),
    ({"channels_last": "yes"}, "channels_last must be true or false, got channels_last='yes'"),
    ({"ratio_schedule": "anneel"}, "Did you mean 'anneal'?"),
    ({"bacth_size": 3}, "unknown key bacth_size, got bacth_size=3. Did you mean 'batch_size'?"),
    ({"training": {"bach_size": 3}}, "Did you mean 'batch_size'?"),
    ({"training": 5}, "training must be a mapping of settings, got training=5"),
])
def test_bad_values_raise_config_error_naming_param_value_and_fix(values, fragment):
    with pytest.raises(ConfigError) as info:
        rla.load_config(preset="atari", **{k: v for k, v in values.items()})
    assert fragment in str(info.value)


def test_ratio_error_message_offers_a_fix():
    with pytest.raises(ConfigError, match=r"Divide each ratio by their sum \(0\.9\)"):
        rla.AccelConfig().merged({"sampling_ratio": [0.6, 0.2, 0.08, 0.02]})


def test_unknown_preset_suggests_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'atari'"):
        rla.get_preset("atary")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_flat_dotted_and_nested_overrides_agree():
    a = rla.load_config(preset="atari", batch_size=64)
    b = rla.load_config(preset="atari", **{"training.batch_size": 64})
    c = rla.load_config(preset="atari", training={"batch_size": 64})
    assert a == b == c and a.training.batch_size == 64


def test_precedence_preset_then_file_then_env_preset_name_then_overrides(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "someone-elses-project"
        [tool.rlaccel]
        preset = "mujoco"
        [tool.rlaccel.training]
        sync_interval = 7
    """))
    cfg = rla.load_config()
    assert cfg.preset == "mujoco" and cfg.training.batch_size == 1024 and cfg.training.sync_interval == 7
    monkeypatch.setenv("RLACCEL_PRESET", "atari")           # env beats the file's preset key
    cfg = rla.load_config()
    assert cfg.preset == "atari" and cfg.training.batch_size == 512 and cfg.training.sync_interval == 7
    cfg = rla.load_config(preset="classic_control", sync_interval=3)   # arguments beat everything
    assert cfg.preset == "classic_control" and cfg.training.sync_interval == 3


def test_rlaccel_config_env_points_at_yaml(tmp_path, monkeypatch):
    path = tmp_path / "accel.yaml"
    path.write_text(textwrap.dedent("""
        replay_buffer:
          levels: 2
          level_capacity: [100, 900]
          sampling_ratio: [0.5, 0.5]
        precision: bf16
    """))
    monkeypatch.setenv("RLACCEL_CONFIG", str(path))
    cfg = rla.load_config()
    assert cfg.replay_buffer.level_capacity == (100, 900) and cfg.precision.dtype == "bf16"
    assert rla.load_config(path) == cfg


def test_malformed_files_raise_config_error(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("replay_buffer: [unclosed")
    with pytest.raises(ConfigError, match="could not be parsed"):
        rla.load_config(bad_yaml)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[training\nbatch_size = ")
    with pytest.raises(ConfigError, match="could not be parsed"):
        rla.load_config(bad_toml)
    with pytest.raises(ConfigError, match="config file must exist"):
        rla.load_config(tmp_path / "missing.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        rla.load_config(listing)


def test_round_trip_through_dict_and_diff():
    cfg = rla.get_preset("sparse_reward")
    assert rla.AccelConfig.from_dict(cfg.to_dict()) == cfg
    assert rla.get_preset("atari").diff(rla.get_preset("mujoco")) == {"training.batch_size": (512, 1024),
                                                                      "replay_buffer.sampling": ("auto", "uniform")}


def test_field_names_are_unique_across_sections():
    total = sum(len(cls.__dataclass_fields__) for cls in SECTIONS.values())
    assert len(FIELD_SECTION) == total


def test_resolved_auto_values_are_concrete():
    from rlaccel_plugins.hardware import resolve_auto

    hw = resolve_auto(rla.load_config(parallel_envs="auto", num_threads="auto", device="auto", precision="auto"))
    assert isinstance(hw.parallel_envs, int) and hw.parallel_envs >= 2
    assert hw.device in ("cpu", "cuda", "mps") and hw.num_threads >= 1
    assert hw.precision in ("fp32", "bf16", "fp16")


@pytest.mark.parametrize("omp, expected", [("1", 1), ("3", 3), ("", None), ("zero", None), ("0", None)])
def test_auto_threads_follow_omp_num_threads_where_the_user_set_it(monkeypatch, omp, expected):
    from rlaccel_plugins.hardware import cpu_count, resolve_auto

    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    threads = resolve_auto(rla.load_config(num_threads="auto")).num_threads
    assert threads == (expected or cpu_count())
    assert resolve_auto(rla.load_config(num_threads=2)).num_threads == 2  # an explicit value is kept


# ---------------------------------------------------------------- property-based: load or ConfigError
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=8), st.sampled_from(["auto", "anneal", "bf16", "cpu", "*.weight"]))
_value = st.one_of(_scalar, st.lists(_scalar, max_size=5), st.dictionaries(st.text(max_size=6), _scalar, max_size=3))
_keys = st.sampled_from([*FIELD_SECTION, *SECTIONS, "preset", "training.batch_size", "nonsense", "precision"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _value, max_size=6))
def test_random_configs_load_or_raise_config_error(data):
    try:
        cfg = rla.AccelConfig().merged(data)
    except ConfigError:
        return
    assert isinstance(cfg, rla.AccelConfig)
    assert math.isclose(sum(cfg.replay_buffer.sampling_ratio), 1.0, abs_tol=1e-6)


def test_a_ready_config_and_a_preset_together_are_refused():
    config = rla.load_config(preset="atari")
    with pytest.raises(rla.ConfigError, match="preset must be None when src is a ready AccelConfig"):
        rla.load_config(config, preset="classic_control")
    assert rla.load_config(config, batch_size=64).training.batch_size == 64


def test_levels_follow_level_capacity_when_omitted(tmp_path):
    path = tmp_path / "rlaccel.yaml"
    path.write_text("replay_buffer:\n  level_capacity: [100, 900]\n  sampling_ratio: [0.5, 0.5]\n")
    assert rla.load_config(path).replay_buffer.levels == 2
    assert rla.load_config(level_capacity=[10, 20, 30], sampling_ratio=[0.2, 0.3, 0.5]).replay_buffer.levels == 3


def test_every_config_field_is_read_outside_config_py():
    # a key that is validated but never applied is a promise nothing keeps: wire it or remove it
    import ast
    import dataclasses
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    read = set()
    for path in [*root.glob("rlaccel_plugins/**/*.py"), *root.glob("adapters/*/rlaccel_*/**/*.py")]:
        if path.name == "config.py":
            continue
        read |= {node.attr for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)}
    unread = [f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
              if f.name not in read]
    assert unread == []


def test_a_typo_in_a_config_file_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "accel.yaml"
    path.write_text("training:\n  bacth_size: 3\n")
    monkeypatch.setenv("RLACCEL_CONFIG", str(path))
    with pytest.raises(ConfigError, match=rf"bacth_size.*in the config file {path} \(RLACCEL_CONFIG\)"):
        rla.load_config()
    monkeypatch.delenv("RLACCEL_CONFIG")
    (tmp_path / "pyproject.toml").write_text("[tool.rlaccel.training]\nbacth_size = 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"in the config file .*pyproject.toml \[tool.rlaccel\]"):
        rla.load_config()
