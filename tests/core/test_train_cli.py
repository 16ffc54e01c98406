"""`rlaccel train` and `rlaccel demo` with tiny budgets, for both frameworks."""

import dataclasses
import json
import time
from pathlib import Path

import pytest

from rlaccel_plugins.cli import main
from rlaccel_plugins.progress import TrainingProgress
from tests.log_helpers import tensorboard_tags

pytestmark = pytest.mark.needs("stable_baselines3", "tianshou", "envpool")


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")  # MLP: dense set = whole net
@pytest.mark.parametrize("framework", ["sb3", "tianshou"])
@pytest.mark.parametrize("stock", [False, True])
def test_train_saves_model_config_and_evaluation_curve(framework, stock, tmp_path, capsys):
    args = ["train", "--framework", framework, "--algo", "dqn", "--env", "CartPole-v1", "--steps", "3000",
            "--eval-freq", "1000", "--no-progress", "--logdir", str(tmp_path), "--set", "batch_size=32"]
    assert main(args + (["--stock"] if stock else [])) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert len(result["curve"]) >= 2 and result["env_steps"] == 3000  # the steps asked, not SB3's whole rounds
    assert result["checkpoint"].endswith("step_000000003000")  # a finished run checkpoints at its end
    assert all(p["train_seconds"] >= 0 for p in result["curve"])
    assert (tmp_path / ("model.zip" if framework == "sb3" else "algorithm.pt")).exists()
    assert "batch_size: 32" in (tmp_path / "rlaccel.yaml").read_text()
    out = capsys.readouterr().out
    assert ("stock:" if stock else "rlaccel[classic_control]:") in out
    assert "the run took" in out and "evaluations and start-up included" in out
    tags = tensorboard_tags(tmp_path)
    assert "eval/mean_reward" in tags
    if not stock:
        assert result["stats"]["full_updates"] > 0
        assert {"rlaccel/fps", "rlaccel/full_updates", "rlaccel/level_fill/L0", "rlaccel/level_samples/L1"} <= tags


@pytest.mark.needs("minatar")
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_without_a_preset_train_uses_the_one_measured_for_the_task_else_the_recipe_with_the_drop_in(
        tmp_path, monkeypatch, capsys):
    from stable_baselines3 import DQN

    def train(env_id, name):
        logdir = tmp_path / name
        assert main(["train", "--env", env_id, "--steps", "300", "--eval-freq", "300", "--no-progress",
                     "--logdir", str(logdir), "--hp", "learning_starts=100"]) == 0
        return logdir, capsys.readouterr().out

    _, out = train("CartPole-v1", "cartpole")  # measured: the classic_control preset's settings
    assert "rlaccel[classic_control]:" in out
    # a MinAtar game was measured with no preset: the MinAtar paper's recipe (batch 32, learning rate 2.5e-4), not
    # CartPole's tuned settings (batch 256, 0.0023, 3-step returns)
    logdir, out = train("MinAtar/Breakout-v1", "minatar")
    assert "no preset was measured for dqn on minatar tasks" in out and "drop-in[default]:" in out
    model = DQN.load(logdir / "model.zip")
    assert model.batch_size == 32 and model.learning_rate == 2.5e-4
    assert type(model.replay_buffer).__name__ == "TieredReplayBuffer"
    assert model.replay_buffer.n_steps == 1
    # a preset the user set outside the code is the one trained with
    monkeypatch.setenv("RLACCEL_PRESET", "off")
    _, out = train("CartPole-v1", "ambient")
    assert "rlaccel[off]:" in out


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # wandb's own imports
def test_wandb_offline_mirrors_the_tensorboard_logs(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = ["train", "--framework", "tianshou", "--steps", "1000", "--eval-freq", "500", "--no-progress",
            "--logdir", str(tmp_path), "--wandb"]
    assert main(args) == 0
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    expected = (b"classic_control", b"eval/mean_reward", b"rlaccel/level_fill/L0", b"rlaccel/fps")
    deadline = time.time() + 60  # wandb's service process may still be writing the offline log under load
    while True:
        records = next(runs[0].glob("run-*.wandb")).read_bytes()  # config + synced scalars
        if all(e in records for e in expected) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert [e for e in expected if e not in records] == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_wandb_without_an_account_says_how_to_fix(tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb")
    wandb.teardown()  # forget the settings (offline mode) an earlier test's run left in this process
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login either
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    assert main(["train", "--steps", "10", "--wandb", "--no-progress", "--logdir", str(tmp_path)]) == 2
    assert "WANDB_MODE=offline" in capsys.readouterr().err


def test_train_reports_bad_overrides_clearly(capsys):
    assert main(["train", "--set", "batch_size"]) == 2
    assert "--set must be KEY=VALUE" in capsys.readouterr().err
    assert main(["train", "--set", "bacth_size=3", "--steps", "10"]) == 2
    assert "Did you mean 'batch_size'" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_shows_speed_and_learning_apart_and_says_what_to_expect(tmp_path, capsys, short_host_probes):
    assert main(["demo", "--seeds", "2", "--steps", "1200", "--segments", "2", "--segment-steps", "600",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    speed = results["speed"]
    assert set(speed) == {"stock", "drop-in, no argument"}
    low, high = speed["drop-in, no argument"]["vs_stock"][1:]
    assert 0 < low <= high
    rows = results["stats"]["tasks"]["sb3 DQN CartPole-v1"]["rows"]
    assert {name: row["runs"] for name, row in rows.items()} == {"stock": 2, "drop-in, no argument": 2}
    assert (tmp_path / "iqm-sb3-dqn-cartpole-v1.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "The drop-in ran the same learning work" in out and "with 2 seeds each" in out
    assert "Host: raw env steps/s before the speed measure and after the learning runs: " in out
    assert "round 2 of 2: env steps/s stock " in out  # the speed measure shows its progress
    assert rows["drop-in, no argument"]["sampled"].startswith("tiers 0.7/0.2/0.08/0.02")  # SB3 DQN: the table's row
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert f"written to {tmp_path}: {', '.join(written)}" in out
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert [name for name in written if f"`{name}`" not in readme] == []  # the README names every file it writes


def test_a_broken_display_never_breaks_training():
    progress = TrainingProgress(total=10, enabled=True, interval=0.0)
    with progress:
        def broken(now):
            raise OSError("terminal closed")

        progress._draw = broken
        progress.update(5, reward=1.0)   # must not raise
        progress.update(6)
    assert progress.steps == 6 and progress.enabled is False


@pytest.mark.slow
def test_pong_command_starts_trains_logs_and_checkpoints(tmp_path, capsys):
    args = ["train", "--framework", "sb3", "--algo", "dqn", "--env", "Pong-v5", "--preset", "atari",
            "--steps", "640", "--eval-freq", "100000", "--no-progress", "--logdir", str(tmp_path),
            "--set", "parallel_envs=8", "--set", "every_steps=320", "--hp", "learning_starts=0",
            "--set", "batch_size=32"]  # the atari preset's 512-frame batches: 0.4 s per gradient step here
    assert main(args) == 0
    assert (tmp_path / "model.zip").exists()
    from rlaccel_plugins.checkpoint import CheckpointStore

    checkpoints = CheckpointStore(tmp_path / "checkpoints").valid()
    assert [c.step for c in checkpoints][-1] == 320 and (checkpoints[0].path / "replay.pkl").exists()
    assert list(tmp_path.glob("DQN_*/events.out.tfevents.*"))  # TensorBoard
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["env_steps"] >= 640 and result["stats"]["full_updates"] >= 1


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
@pytest.mark.parametrize("framework", ["sb3", "tianshou"])
def test_train_async_counts_every_step(framework, tmp_path):
    import torch

    threads = torch.get_num_threads()
    args = ["train", "--framework", framework, "--steps", "3000", "--eval-freq", "1000", "--no-progress",
            "--logdir", str(tmp_path), "--async", "--set", f"num_threads={threads + 1}"]
    assert main(args) == 0
    assert torch.get_num_threads() == threads  # the run's thread count is its own, not the caller's after it
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["env_steps"] == 3000 and len(result["curve"]) == 3


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_drop_in_is_the_stock_recipe_plus_only_the_readme_drop_in(tmp_path, capsys):
    from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
    from rlaccel_sb3.train import build
    from rlaccel_tianshou import SparseDenseWrapper, TieredVectorReplayBuffer
    from rlaccel_tianshou.train import TianshouTraining

    from rlaccel_plugins.errors import ConfigError
    from rlaccel_plugins.loader import load_config
    from rlaccel_plugins.training import TrainSpec

    def spec(framework, **flags):
        return TrainSpec(framework=framework, algo="dqn", env_id="CartPole-v1",
                         config=load_config(preset="classic_control"), steps=2_000, **flags)

    (stock, _), (dropin, callbacks) = build(spec("sb3", stock=True)), build(spec("sb3", dropin=True))
    for name in ("batch_size", "learning_rate", "buffer_size", "train_freq", "gradient_steps", "target_update_interval",
                 "n_envs", "gamma", "exploration_fraction"):
        assert getattr(dropin, name) == getattr(stock, name), name  # no hyper-parameter changed
    assert dropin.policy_kwargs == stock.policy_kwargs
    assert isinstance(dropin.replay_buffer, TieredReplayBuffer) and type(stock.replay_buffer) is not TieredReplayBuffer
    assert dropin.replay_buffer.engine.capacity == stock.buffer_size  # the preset's tiers fitted into it
    assert [type(c) for c in callbacks] == [AccelerateCallback]
    stock_ts, dropin_ts = TianshouTraining(spec("tianshou", stock=True)), TianshouTraining(spec("tianshou", dropin=True))
    assert (dropin_ts.batch, dropin_ts.ups, dropin_ts.num_envs, dropin_ts.hidden) == \
        (stock_ts.batch, stock_ts.ups, stock_ts.num_envs, stock_ts.hidden)
    assert isinstance(dropin_ts.buffer, TieredVectorReplayBuffer) and dropin_ts.buffer.maxsize == stock_ts.buffer.maxsize
    assert isinstance(dropin_ts.algorithm, SparseDenseWrapper) and dropin_ts.algorithm.fused
    with pytest.raises(ConfigError, match="--drop-in must not be given with --stock"):
        spec("sb3", stock=True, dropin=True)
    args = ["train", "--framework", "sb3", "--drop-in", "--steps", "1500", "--eval-freq", "1500", "--no-progress",
            "--logdir", str(tmp_path)]
    assert main(args) == 0
    assert "drop-in[classic_control]:" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
@pytest.mark.parametrize("stock", [False, True])
def test_tianshou_steps_is_a_cap_that_counts_the_warm_up(stock):
    from rlaccel_tianshou.train import TianshouTraining

    from rlaccel_plugins.config import AccelConfig
    from rlaccel_plugins.training import EvalClock, TrainSpec

    spec = TrainSpec(framework="tianshou", algo="dqn", env_id="CartPole-v1", config=AccelConfig(), steps=1500,
                     eval_freq=1000, stock=stock, progress=False)  # 1500 is not a multiple of the epoch
    training = TianshouTraining(spec)
    with TrainingProgress(total=spec.steps, enabled=False) as progress:
        learned = training.learn(progress, EvalClock())
    assert 1500 <= learned.env_steps < 1500 + training.num_envs  # within one vector step (was 2,000 + warm-up)
    assert len(training.buffer) == learned.env_steps  # what was counted is what was collected


def test_the_callers_replay_config_reaches_the_buffers_rlaccel_builds(monkeypatch):
    # rlaccel's own buffers take the run's config; the ambient one (here RLACCEL_PRESET) is for
    # buffers SB3 or Tianshou build from a class name
    from rlaccel_sb3.train import build
    from rlaccel_tianshou import TieredVectorReplayBuffer

    from rlaccel_plugins.loader import load_config
    from rlaccel_plugins.training import TrainSpec

    config = load_config(preset="classic_control", ratio_schedule="anneal", anneal_steps=777, dedup_frames=False)
    monkeypatch.setenv("RLACCEL_PRESET", "atari")
    model, _ = build(TrainSpec(framework="sb3", algo="dqn", env_id="CartPole-v1", config=config, steps=1000))
    engine = model.replay_buffer.engine  # the engine keeps every field but n_step (the buffer applies it)
    assert dataclasses.replace(engine.config, n_step=3) == config.replay_buffer and model.replay_buffer.n_steps == 3
    buffer = TieredVectorReplayBuffer(config.replay_buffer.capacity, 2, replay_config=config.replay_buffer)
    assert buffer.sampler.ratio_schedule == "anneal" and buffer.anneal_steps == 777
    assert buffer.sampler.layout.level_capacity.tolist() == [5000, 45000]


@pytest.mark.parametrize("algo", ["dqnn", "sac"])  # unknown; continuous actions only, on CartPole
def test_a_bad_algorithm_is_refused_before_the_run_folder_exists(algo, tmp_path, capsys):
    logdir = tmp_path / "run"
    assert main(["train", "--framework", "sb3", "--algo", algo, "--env", "CartPole-v1", "--steps", "100",
                 "--no-progress", "--logdir", str(logdir)]) == 2
    assert "algo must" in capsys.readouterr().err
    assert not logdir.exists()


def test_presets_show_only_the_keys_their_sampling_reads(capsys):
    assert main(["presets", "show", "mujoco"]) == 0
    shown = capsys.readouterr().out
    assert "sampling: uniform" in shown and "sampling_ratio" not in shown.split("# not shown")[0]
    assert "# not shown: sampling_ratio, ratio_schedule, importance_beta" in shown
    assert main(["presets", "show", "default"]) == 0
    assert "sampling_ratio: [0.7, 0.2, 0.08, 0.02]" in capsys.readouterr().out
