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


def _tianshou_policies():
    import gymnasium as gym
    import torch
    from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
    from tianshou.algorithm.modelfree.sac import SACPolicy
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic
    from tianshou.utils.net.discrete import DiscreteActor

    cart, pend = gym.make("CartPole-v1"), gym.make("Pendulum-v1")
    torch.manual_seed(0)
    ppo_discrete = ProbabilisticActorPolicy(
        actor=DiscreteActor(preprocess_net=Net(state_shape=4, hidden_sizes=[32]), action_shape=2),
        dist_fn=torch.distributions.Categorical, action_space=cart.action_space, action_scaling=False,
        deterministic_eval=True)

    def gaussian(loc_scale):
        loc, scale = loc_scale
        return torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)

    def continuous_actor(unbounded):
        return ContinuousActorProbabilistic(preprocess_net=Net(state_shape=3, hidden_sizes=[32]), action_shape=1,
                                            unbounded=unbounded)

    ppo_continuous = ProbabilisticActorPolicy(actor=continuous_actor(False), dist_fn=gaussian,
                                              action_space=pend.action_space, action_bound_method="clip",
                                              deterministic_eval=True)
    sac = SACPolicy(actor=continuous_actor(True), action_space=pend.action_space)
    return [("PPO discrete", ppo_discrete, cart), ("PPO continuous", ppo_continuous, pend), ("SAC", sac, pend)]


def test_tianshou_actor_policies_export_like_their_own_deterministic_action(tmp_path):
    import onnxruntime
    import torch
    from rlaccel_tianshou.export import export_policy
    from tianshou.data import Batch

    for name, policy, env in _tianshou_policies():
        path = tmp_path / f"{name.replace(' ', '_')}.onnx"
        report = export_policy(policy, env.observation_space, path)
        assert report["mismatches"] == 0, name
        env.observation_space.seed(2)
        obs = np.stack([env.observation_space.sample() for _ in range(500)]).astype(np.float32)
        policy.eval()
        with torch.no_grad():
            expected = policy.map_action(policy(Batch(obs=obs, info={})).act)
        got = onnxruntime.InferenceSession(str(path)).run(None, {"obs": obs})[0]
        expected = np.asarray(expected.cpu() if hasattr(expected, "cpu") else expected)
        if expected.dtype.kind in "iu":
            assert np.array_equal(got, expected), name
        else:
            np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=name)
