"""``training.compiled_updates`` for the on-policy algorithms, against SB3's ``train()`` on the same rollout:
PPO's minibatch steps of a ``train()`` call (every epoch's) — ``evaluate_actions``, the clipped loss, SB3's
gradient clipping and Adam — as one compiled loop; A2C's one step on the rollout with RMSprop (or Adam).

As for DQN: run without the compiler, the step function is SB3's ``train()`` bit for bit (Categorical and
diagonal Gaussian actions, the clipped value loss, advantage normalisation); compiled, it rounds
differently and may stray from SB3's run no further than ``DRIFT`` times PyTorch's single-kernel Adam
does on the same work; a one-line change to the loss strays beyond that. Where a call cannot be one
loop (``target_kl``, a last minibatch of another size) its minibatches run eagerly, SB3's bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences

pytestmark = [pytest.mark.needs("stable_baselines3"), pytest.mark.xdist_group("compiled_on_policy")]

CALLS = 3  # train() calls on one rollout, each one loop of 4 epochs x 4 minibatches
A2C_CALLS = 40  # train() calls on one rollout of 8 steps x 1 env: one step each
DRIFT = 20.0
SETTINGS = {"PPO": dict(n_steps=256, batch_size=64, n_epochs=4, ent_coef=0.01), "A2C": dict(n_steps=8, ent_coef=0.01)}


def _collected(env: str = "CartPole-v1", algo: str = "PPO", **kwargs):
    """A model with one rollout collected by SB3's own loop (the same rollout for the same arguments)."""
    import stable_baselines3

    # one hidden layer of 32: the smallest graph that has every op, for the compilation CI pays
    model = getattr(stable_baselines3, algo)("MlpPolicy", env, seed=3, policy_kwargs=dict(net_arch=[32]),
                                             **{**SETTINGS[algo], **kwargs})
    _, callback = model._setup_learn(total_timesteps=10**6, callback=None)
    callback.on_training_start(locals(), globals())
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
    return model


def _run(model, train, calls: int = CALLS) -> dict:
    np.random.seed(11)
    logged = []
    for _ in range(calls):
        train()
        logged.append({k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")})
    state = model.policy.optimizer.state.values()
    return {"parameters": torch.cat([p.detach().flatten() for p in model.policy.parameters()]),
            "state": [v.clone() for s in state for k, v in s.items() if k != "step"],
            "steps": [float(s["step"]) for s in state], "logged": logged,
            "n_updates": model._n_updates, "rng": np.random.get_state()[1].copy()}


def _gap(expected: dict, actual: dict) -> float:
    return float((expected["parameters"] - actual["parameters"]).abs().max() / expected["parameters"].abs().max())


def _uncompiled(monkeypatch) -> None:
    from rlaccel_plugins.fused import compiled_step

    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)


@pytest.fixture(scope="module")
def runs() -> dict:
    from rlaccel_sb3.fused import fused_train_for

    models = {name: _collected() for name in ("stock", "single-kernel adam", "compiled")}
    compiled = fused_train_for(models["compiled"], compiled=True)
    runs = {"stock": _run(models["stock"], models["stock"].train),
            "single-kernel adam": _run(models["single-kernel adam"],
                                       fused_train_for(models["single-kernel adam"], fused_optimizer=True)),
            "compiled": _run(models["compiled"], compiled)}
    runs["compiled step"] = compiled.graphs.compiled_step
    return runs


def test_the_compiled_loop_agrees_with_sb3_within_the_derived_tolerance(runs):
    stock, compiled, reference = runs["stock"], runs["compiled"], runs["single-kernel adam"]
    assert runs["compiled step"] is not None and runs["compiled step"].failed is None
    assert differences(stock["parameters"], compiled["parameters"])  # it compiled: not bit for bit
    assert _gap(stock, compiled) <= DRIFT * max(_gap(stock, reference), 1e-7)
    assert compiled["n_updates"] == stock["n_updates"] and compiled["steps"] == stock["steps"]
    assert np.array_equal(compiled["rng"], stock["rng"])  # the same permutation draws
    assert differences(stock["logged"], compiled["logged"], rtol=1e-3, atol=1e-6) == []


@pytest.mark.parametrize(("env", "kwargs"), [
    ("CartPole-v1", {}),
    ("CartPole-v1", dict(clip_range_vf=0.2, normalize_advantage=False)),
    ("Pendulum-v1", {}),  # diagonal Gaussian: log_std
])
def test_run_without_the_compiler_it_is_sb3s_train_bit_for_bit(monkeypatch, env, kwargs):
    from rlaccel_sb3.fused import fused_train_for

    _uncompiled(monkeypatch)
    stock, ours = _collected(env, **kwargs), _collected(env, **kwargs)
    train = fused_train_for(ours, compiled=True)
    assert differences(_run(stock, stock.train), _run(ours, train)) == []
    assert train.graphs.compiled_step is not None  # the compiled step's function ran, not the eager path


@pytest.mark.parametrize("kwargs", [dict(target_kl=0.002), dict(batch_size=96)])
def test_a_call_that_cannot_be_one_loop_runs_eagerly_as_sb3s(monkeypatch, kwargs):
    """``target_kl`` reads the KL before each step; 256 rows in minibatches of 96 end with one of 64."""
    from rlaccel_sb3.fused import fused_train_for, on_policy

    _uncompiled(monkeypatch)
    looped = []
    monkeypatch.setattr(on_policy, "_loop_inputs", lambda *args, real=on_policy._loop_inputs: looped.append(1) or
                        real(*args))
    stock, ours = _collected(**kwargs), _collected(**kwargs)
    assert differences(_run(stock, stock.train), _run(ours, fused_train_for(ours, compiled=True))) == []
    assert looped == []


def test_a_one_line_change_to_the_loss_strays_beyond_the_tolerance(runs, monkeypatch):
    from rlaccel_sb3.fused import fused_train_for, on_policy

    _uncompiled(monkeypatch)
    loss_of = on_policy._ppo_compiled_loss

    def value_coefficient_0_45(params, spec, constants, *inputs):
        normalize, ent_coef, vf_coef, clip_values = constants
        return loss_of(params, spec, (normalize, ent_coef, vf_coef * 0.9, clip_values), *inputs)

    monkeypatch.setattr(on_policy, "_ppo_compiled_loss", value_coefficient_0_45)
    model = _collected()
    changed = _run(model, fused_train_for(model, compiled=True))
    assert _gap(runs["stock"], changed) > DRIFT * max(_gap(runs["stock"], runs["single-kernel adam"]), 1e-7)


# ---------------------------------------------------------------------------------------------------- A2C
@pytest.mark.parametrize(("env", "kwargs"), [
    ("CartPole-v1", {}),                                          # RMSprop, SB3's default
    ("Pendulum-v1", dict(normalize_advantage=True)),              # Gaussian, log_std, normalised advantages
    ("CartPole-v1", dict(use_rms_prop=False)),                    # Adam
])
def test_a2c_run_without_the_compiler_is_sb3s_train_bit_for_bit(monkeypatch, env, kwargs):
    from rlaccel_sb3.fused import fused_train_for

    _uncompiled(monkeypatch)
    stock, ours = _collected(env, "A2C", **kwargs), _collected(env, "A2C", **kwargs)
    train = fused_train_for(ours, compiled=True)
    assert differences(_run(stock, stock.train, A2C_CALLS), _run(ours, train, A2C_CALLS)) == []
    assert train.graphs.compiled_step is not None


def test_the_compiled_a2c_step_agrees_with_sb3_and_a_changed_loss_strays(monkeypatch):
    """RMSprop has no single-kernel implementation to derive the tolerance from: the compiled run may stray
    from SB3's no further than ``DRIFT`` times float32's resolution relative to the weights, and a 10%
    change of the value coefficient strays beyond it."""
    from rlaccel_sb3.fused import fused_train_for, on_policy

    stock, ours = _collected(algo="A2C"), _collected(algo="A2C")
    expected = _run(stock, stock.train, A2C_CALLS)
    compiled = fused_train_for(ours, compiled=True)
    actual = _run(ours, compiled, A2C_CALLS)
    assert compiled.graphs.compiled_step is not None and compiled.graphs.compiled_step.failed is None
    bound = DRIFT * float(torch.finfo(torch.float32).eps) * A2C_CALLS
    assert differences(expected["parameters"], actual["parameters"])  # it compiled: not bit for bit
    assert _gap(expected, actual) <= bound
    assert actual["n_updates"] == expected["n_updates"] and np.array_equal(actual["rng"], expected["rng"])

    _uncompiled(monkeypatch)
    loss_of = on_policy._a2c_compiled_loss

    def value_coefficient_off(params, spec, constants, *inputs):
        normalize, ent_coef, vf_coef = constants
        return loss_of(params, spec, (normalize, ent_coef, vf_coef * 0.9), *inputs)

    monkeypatch.setattr(on_policy, "_a2c_compiled_loss", value_coefficient_off)
    changed = _collected(algo="A2C")
    assert _gap(expected, _run(changed, fused_train_for(changed, compiled=True), A2C_CALLS)) > bound
