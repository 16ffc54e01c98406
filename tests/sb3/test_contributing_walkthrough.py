"""The Contributing page's walk-through, followed for a toy algorithm: one registry entry gives it dispatch,
its compiled-step settings and its docs row; it runs fused only once its code is recorded as verified."""

import pytest
from stable_baselines3 import DQN

from rlaccel_plugins.errors import RlaccelWarning


class ToyDQN(DQN):
    """A new algorithm with a ``train`` of its own (here SB3's, so the fused DQN step computes it)."""

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        super().train(gradient_steps, batch_size)


@pytest.fixture
def toy_entry(monkeypatch):
    from rlaccel_sb3 import fused
    from rlaccel_sb3.fused import registry, value_based

    entry = registry.FusedAlgorithm("ToyDQN", __name__, value_based.dqn_train, (f"{__name__}:ToyDQN.train",),
                                    compiled=value_based.compiled_dqn_step, break_even=10)
    for module in (registry, fused):  # the registry's one list, as the package re-exports it
        monkeypatch.setattr(module, "ALGORITHMS", (*registry.ALGORITHMS, entry))
    return entry


def test_a_toy_algorithm_registered_as_contributing_says_gets_dispatch_compiled_settings_and_a_docs_row(toy_entry):
    from rlaccel_sb3 import fused
    from rlaccel_sb3.fused import registry

    model = ToyDQN("MlpPolicy", "CartPole-v1", learning_starts=0, train_freq=4, seed=0)
    assert toy_entry.family == "value_based"  # read from its builder's module
    assert fused.trains()[ToyDQN.train] is toy_entry
    assert fused.fused_train_for(model) is not None
    assert fused.break_even(model) == 10 and fused.compiled_unavailable(model) is None
    assert "| ToyDQN | `value_based` | yes (10 gradient steps) | `ToyDQN.train` and 0 more |" in \
        registry.support_markdown()


def test_the_toy_algorithm_runs_its_own_train_until_its_code_is_recorded_as_verified(toy_entry, monkeypatch):
    from rlaccel_sb3 import AccelerateCallback

    from rlaccel_plugins.fused import selection

    monkeypatch.setattr(selection, "_REPORTED", set())  # the one warning per process, shown here

    model = ToyDQN("MlpPolicy", "CartPole-v1", learning_starts=0, train_freq=4, seed=0)
    callback = AccelerateCallback(preset="off", fused_updates="auto")
    callback.init_callback(model)
    with pytest.warns(RlaccelWarning, match=r"running SB3's own update for ToyDQN.*'train:ToyDQN'"):
        assert callback._fused_train() is None
