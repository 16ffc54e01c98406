"""Fused and lean paths run only on the framework code they were verified against."""

import json

import gymnasium as gym
import pytest

from rlaccel_plugins.errors import ConfigError, RlaccelWarning
from rlaccel_plugins.fused import selection
from rlaccel_plugins.fused.fingerprints import Record, VerifiedCode, source_fingerprint
from tools import fingerprints as tools_fingerprints


def adapters_code():
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("tianshou")
    from rlaccel_sb3.verified import CODE as SB3
    from rlaccel_tianshou.verified import CODE as TIANSHOU

    return {"sb3": SB3, "tianshou": TIANSHOU}


def test_every_replaced_method_matches_the_code_it_was_verified_against():
    stale = {f"{name} {key}": code.differences(key) for name, code in adapters_code().items()
             for key in code.replacements}
    stale = {k: v for k, v in stale.items() if v}
    assert not stale, ("the installed framework code differs from what the fused paths were verified against: "
                       f"{stale}. Re-run the equivalence tests, then `python -m tools.fingerprints "
                       "--update`.")


def test_fingerprints_ignore_comments_formatting_and_docstrings_but_not_code():
    base = source_fingerprint("class A:\n    '''Doc.'''\n    def f(self, x):\n        return x * 2  # twice\n")
    assert base == source_fingerprint("class A:\n  def f(self, x): return (x*2)\n")
    assert base != source_fingerprint("class A:\n    def f(self, x):\n        return x * 3\n")
    assert base != source_fingerprint("class A:\n    def f(self, y):\n        return y * 2\n")


def tampered(code: VerifiedCode, key: str, tmp_path) -> VerifiedCode:
    """``code`` with a record whose first digest of ``key`` is not the installed one."""
    record = Record.load(code.record_path)
    target = code.replacements[key].targets[0]
    record.digests[key][target] = "0" * 64
    record.save(tmp_path / "verified.json")
    return VerifiedCode(code.replacements, tmp_path / "verified.json", code.distributions)


@pytest.fixture
def fresh_reports(monkeypatch):
    monkeypatch.setattr(selection, "_REPORTED", set())


def test_changed_framework_code_makes_auto_run_the_framework_and_true_refuse(tmp_path, monkeypatch, fresh_reports):
    from rlaccel_sb3 import AccelerateCallback, verified
    from stable_baselines3 import DQN

    code = tampered(verified.CODE, "train:DQN", tmp_path)
    monkeypatch.setattr(verified, "CODE", code)
    message = code.unverified("train:DQN")
    assert "stable_baselines3.dqn.dqn:DQN.train" in message and "stable-baselines3 2." in message
    assert "Report it to the rlaccel maintainers" in message

    def callback_for(setting):
        model = DQN("MlpPolicy", "CartPole-v1", learning_starts=0, train_freq=4, seed=0)
        callback = AccelerateCallback(preset="off", fused_updates=setting)
        callback.init_callback(model)
        return callback

    with pytest.warns(RlaccelWarning, match=r"running SB3's own update for DQN \(fused_updates=auto\).*DQN.train"):
        assert callback_for("auto")._fused_train() is None
    with pytest.raises(ConfigError, match=r"fused_updates=true needs SB3's code as rlaccel verified it"):
        callback_for(True)._fused_train()
    # the lean collection, still verified, is kept
    assert callback_for("auto")._lean_collection()


def without(code: VerifiedCode, key: str) -> VerifiedCode:
    """``code`` as if nobody had listed the framework code of ``key``'s path."""
    return VerifiedCode({k: r for k, r in code.replacements.items() if k != key}, code.record_path, code.distributions)


def test_a_fused_path_nobody_listed_fails_closed_in_both_adapters(monkeypatch, fresh_reports):
    from rlaccel_sb3 import AccelerateCallback
    from rlaccel_sb3 import verified as sb3_verified
    from rlaccel_tianshou import verified as tianshou_verified
    from rlaccel_tianshou.wrapper import _fused_update
    from stable_baselines3 import DQN
    from tianshou.algorithm import DQN as TianshouDQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    from rlaccel_plugins.loader import load_config

    assert "update:DQN" in tianshou_verified.CODE.replacements  # derived from the registry
    monkeypatch.setattr(sb3_verified, "CODE", without(sb3_verified.CODE, "train:DQN"))
    monkeypatch.setattr(tianshou_verified, "CODE", without(tianshou_verified.CODE, "update:DQN"))

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=0, train_freq=4, seed=0)
    callback = AccelerateCallback(preset="off", fused_updates="auto")
    callback.init_callback(model)
    with pytest.warns(RlaccelWarning, match=r"running SB3's own update for DQN.*lists no framework code for 'train:DQN'"):
        assert callback._fused_train() is None

    policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[16]),
                                     action_space=gym.spaces.Discrete(2))
    algorithm = TianshouDQN(policy=policy, optim=AdamOptimizerFactory())
    with pytest.warns(RlaccelWarning, match=r"running Tianshou's own update for DQN.*'update:DQN'"):
        assert _fused_update(algorithm, load_config(fused_updates="auto")) is None
    with pytest.raises(ConfigError, match="fused_updates=true needs Tianshou's code as rlaccel verified it"):
        _fused_update(algorithm, load_config(fused_updates=True))


def test_changed_collector_code_makes_the_lean_collector_tianshou_s_own(tmp_path, monkeypatch, fresh_reports):
    import gymnasium as gym
    from rlaccel_tianshou import LeanCollector, verified
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net

    policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[16]),
                                     action_space=gym.spaces.Discrete(2), eps_training=0.1)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    collector = LeanCollector(DQN(policy=policy, optim=AdamOptimizerFactory()), envs, VectorReplayBuffer(100, 2),
                              exploration_noise=True)
    assert collector.lean and collector.lean_loop
    monkeypatch.setattr(verified, "CODE", tampered(verified.CODE, "collector", tmp_path))
    with pytest.warns(RlaccelWarning, match="running Tianshou's own collection for Collector"):
        assert not collector.lean
    collector.reset()
    assert collector.collect(n_step=10).n_collected_steps == 10 and not collector.lean_loop


def test_update_records_the_installed_code_and_check_reports_it(tmp_path, monkeypatch, capsys):
    code = adapters_code()["sb3"]
    copy = VerifiedCode(code.replacements, tmp_path / "verified.json", code.distributions)
    monkeypatch.setattr(tools_fingerprints, "adapters_code", lambda: {"sb3": copy})
    assert tools_fingerprints.main([]) == 1  # nothing recorded yet: every path differs
    assert "DIFFERS" in capsys.readouterr().out
    assert tools_fingerprints.main(["--update"]) == 0
    assert tools_fingerprints.main([]) == 0
    data = json.loads((tmp_path / "verified.json").read_text())
    assert data["digests"] == Record.load(code.record_path).digests
