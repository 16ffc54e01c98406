"""``training.compiled_updates: true`` on Tianshou's DQN and SAC: the gradient step (DQN: the loss on the n-step
returns, backward, the clip, Adam; SAC: both critics', the actor's and the coefficient's steps and the
Polyak average) compiled whole, against Tianshou's own update over 200 updates.

Run without the compiler, the compiled step's function is Tianshou's update bit for bit (every update's
stats, then parameters, target network, optimizer state, counters and every RNG); compiled, it rounds
differently and strays from Tianshou's run no further than ``DRIFT`` times as far as PyTorch's single-kernel
Adam (``training.fused_optimizer``, another re-rounding of the same math) does; a one-line change to the
loss strays far beyond (the tolerance the SB3 compiled steps are held to).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlaccel_plugins.fused import differences
from tests.equivalence.test_tianshou_fused import _actor_critic, _algorithm, _buffer, _run

pytestmark = [pytest.mark.needs("tianshou"), pytest.mark.xdist_group("compiled")]

DRIFT = 20.0
EXACT = ("stats", "state", "optimizers", "counters", "torch_rng", "numpy_rng", "buffer")


@pytest.fixture
def uncompiled(monkeypatch):
    from rlaccel_plugins.fused import compiled_step

    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)


@pytest.mark.parametrize(("kind", "kwargs"), [
    ("vector", {}),                                                   # double DQN, 3-step, MSE, target every 10
    ("vector", dict(is_double=False, huber=1.0, n_step=1, target=0)),  # Huber, no target network
    ("tiered-weighted", {}),                                          # importance weights in the MSE loss
])
def test_the_compiled_dqn_step_run_eagerly_is_tianshous_update_bit_for_bit(uncompiled, kind, kwargs):
    _assert_bit_for_bit(_algorithm(**kwargs), kind)


@pytest.mark.parametrize(("kind", "kwargs"), [
    ("vector", {}),                                          # auto-tuned alpha, 1-step
    ("tiered-weighted", dict(auto_alpha=False, n_step=2)),   # fixed alpha, importance weights in the critics' losses
])
def test_the_compiled_sac_step_run_eagerly_is_tianshous_update_bit_for_bit(uncompiled, kind, kwargs):
    _assert_bit_for_bit(_actor_critic("SAC", **kwargs), kind)


def _assert_bit_for_bit(algorithm, kind: str) -> None:
    env_id = "CartPole-v1" if type(algorithm).__name__ == "DQN" else "Pendulum-v1"
    stock, compiled = _runs(algorithm, _buffer(kind, algorithm, env_id), {"stock": dict(fused_updates=False),
                                                                          "compiled": dict(compiled_updates=True)})
    assert compiled["ran compiled"]
    assert differences({k: stock[k] for k in EXACT}, {k: compiled[k] for k in EXACT}) == []


def _runs(algorithm, buffer, variants: dict[str, dict]) -> list[dict]:
    """:func:`_run` of a wrapper around a copy of ``algorithm`` and ``buffer`` per variant's config overrides."""
    from rlaccel_tianshou import SparseDenseWrapper

    from rlaccel_plugins.loader import load_config

    results = []
    for overrides in variants.values():
        wrapper = SparseDenseWrapper(copy.deepcopy(algorithm), config=load_config(preset="classic_control", **overrides))
        result, _ = _run(wrapper, copy.deepcopy(buffer), record=False)  # a compiled step computes no .grad
        results.append({**result, "ran compiled": wrapper.compiled})
    return results


def _gap(expected: dict, actual: dict) -> float:
    """The largest difference of the algorithm's weights relative to their scale."""
    flat = [torch.cat([v.flatten() for v in run["state"].values() if torch.is_tensor(v) and v.is_floating_point()])
            for run in (expected, actual)]
    return float((flat[0] - flat[1]).abs().max() / flat[0].abs().max())


@pytest.fixture(scope="module")
def runs():
    """Per algorithm (made once): Tianshou's own and the single-kernel Adam's runs of one double 3-step DQN,
    or one SAC with an auto-tuned coefficient, with the algorithm and buffer they start from."""
    made: dict[str, dict] = {}

    def of(name: str) -> dict:
        if name not in made:
            algorithm = _algorithm() if name == "DQN" else _actor_critic(name)
            buffer = _buffer("vector", algorithm, "CartPole-v1" if name == "DQN" else "Pendulum-v1")
            variants = {"stock": dict(fused_updates=False), "single-kernel adam": dict(fused_optimizer=True)}
            made[name] = {**dict(zip(variants, _runs(algorithm, buffer, variants))), "algorithm": algorithm,
                          "buffer": buffer}
        return made[name]
    return of


@pytest.mark.parametrize("name", ["DQN", "SAC"])
def test_the_compiled_step_agrees_with_tianshou_within_the_derived_tolerance(runs, name):
    made = runs(name)
    stock, reference = made["stock"], made["single-kernel adam"]
    (compiled,) = _runs(made["algorithm"], made["buffer"], {"compiled": dict(compiled_updates=True)})
    assert compiled["ran compiled"]
    assert differences(stock["state"], compiled["state"])  # it compiled: not bit for bit
    assert _gap(stock, compiled) <= DRIFT * max(_gap(stock, reference), 1e-7)
    # what does not depend on rounding is equal: the counters, every RNG draw, the buffer
    for key in ("counters", "torch_rng", "numpy_rng", "buffer"):
        assert differences(stock[key], compiled[key]) == [], key
    assert differences(stock["stats"], compiled["stats"], rtol=1e-3, atol=1e-5) == []


@pytest.mark.parametrize("name", ["DQN", "SAC"])
def test_a_one_line_change_to_the_compiled_step_strays_beyond_the_tolerance(runs, uncompiled, monkeypatch, name):
    from rlaccel_tianshou.fused import compiled_sac, value_based

    if name == "DQN":  # the returns 0.1% off
        original = value_based._dqn_compiled_loss
        monkeypatch.setattr(value_based, "_dqn_compiled_loss", lambda params, kinds, delta, obs, act, returns, *weight:
                            original(params, kinds, delta, obs, act, returns * 1.001, *weight))
    else:  # the entropy term 0.1% off
        sample = compiled_sac._squashed_gaussian

        def entropy_off(*args):
            act, log_prob = sample(*args)
            return act, log_prob * 1.001
        monkeypatch.setattr(compiled_sac, "_squashed_gaussian", entropy_off)
    made = runs(name)
    (changed,) = _runs(made["algorithm"], made["buffer"], {"changed": dict(compiled_updates=True)})
    assert _gap(made["stock"], changed) > DRIFT * max(_gap(made["stock"], made["single-kernel adam"]), 1e-7)


def test_compiled_updates_true_refuses_what_has_no_compiled_step_and_auto_stays_eager():
    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    from rlaccel_plugins.errors import ConfigError
    from rlaccel_plugins.loader import load_config

    def config(**overrides):
        return load_config(preset="classic_control", **overrides)

    with pytest.raises(ConfigError, match="compiled_updates=true needs a compiled gradient step, got TD3"):
        SparseDenseWrapper(_actor_critic("TD3"), config=config(compiled_updates=True))
    with pytest.raises(ConfigError, match="got DQN: the fused update is off"):
        SparseDenseWrapper(_algorithm(), config=config(compiled_updates=True, fused_updates=False))
    dueling = DQN(policy=DiscreteQLearningPolicy(
        model=Net(state_shape=4, action_shape=2, hidden_sizes=[16], dueling_param=({}, {})),
        action_space=_algorithm().policy.action_space), optim=AdamOptimizerFactory())
    with pytest.raises(ConfigError, match="got DQN: the Q-network is not a Net"):
        SparseDenseWrapper(dueling, config=config(compiled_updates=True))
    assert SparseDenseWrapper(_algorithm(), config=config())._compile is False  # auto: eager on Tianshou


def test_compiled_updates_win_over_the_single_kernel_optimizer(uncompiled):
    """``fused_optimizer: true`` asks for PyTorch's single-kernel Adam, which a compiled step cannot step: with
    ``compiled_updates: true`` too, the compiled step runs (as SB3's callback does), not the eager update."""
    algorithm = _algorithm()
    (run,) = _runs(algorithm, _buffer("vector", algorithm), {"both": dict(compiled_updates=True, fused_optimizer=True)})
    assert run["ran compiled"]
