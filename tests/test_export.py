"""`rlaccel export`: ONNX graphs that act exactly like the saved policies (checked in onnxruntime)."""

import json

import numpy as np
import pytest

from rlaccel_plugins.cli import main

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("algo, env_id", [("DQN", "CartPole-v1"), ("PPO", "CartPole-v1"), ("PPO", "Pendulum-v1"),
                                          ("SAC", "Pendulum-v1")])
def test_sb3_export_acts_like_model_predict(algo, env_id, tmp_path, capsys):
    import onnxruntime
    import stable_baselines3

    cls = getattr(stable_baselines3, algo)
    kwargs = {"learning_starts": 100} if algo in ("DQN", "SAC") else {"n_steps": 64, "batch_size": 32}
    model = cls("MlpPolicy", env_id, seed=0, policy_kwargs=dict(net_arch=[32, 32]), **kwargs)
    model.learn(300)
    model.save(tmp_path / "model.zip")
    assert main(["export", str(tmp_path / "model.zip"), "--onnx", str(tmp_path / "policy.onnx")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["observations"] == 1000 and report["mismatches"] == 0
    # the users' check: ONNX actions == model.predict(deterministic=True) on fresh observations
    space = model.observation_space
    space.seed(1)
    obs = np.stack([space.sample() for _ in range(1000)]).astype(np.float32)
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"))
    got = session.run(None, {"obs": obs})[0]
    expected, _ = model.predict(obs, deterministic=True)
    if np.issubdtype(expected.dtype, np.integer):
        assert np.array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_tianshou_export_of_a_trained_run(tmp_path, capsys):
    args = ["train", "--framework", "tianshou", "--steps", "600", "--eval-freq", "600", "--no-progress",
            "--logdir", str(tmp_path)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path), "--onnx", str(tmp_path / "policy.onnx")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["framework"] == "tianshou" and report["mismatches"] == 0 and report["observations"] == 1000


def test_export_errors_name_the_problem(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing.zip"), "--onnx", "x.onnx"]) == 2
    assert "MODEL must be an existing file" in capsys.readouterr().err
    bad = tmp_path / "model.zip"
    bad.write_bytes(b"not a zip")
    assert main(["export", str(bad), "--onnx", str(tmp_path / "p.onnx")]) == 2
    assert "MODEL must be an SB3 model .zip" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--onnx", str(tmp_path / "p.onnx")]) == 2
    assert "algorithm.pt of an `rlaccel train --framework tianshou` run" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.onnx")) and not list(tmp_path.glob(".*tmp*"))
