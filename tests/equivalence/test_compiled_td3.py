"""``training.compiled_updates`` for TD3 and DDPG: the critics' update and, every ``policy_delay`` steps, the
actor's and the Polyak averages as one call (or a ``train()`` call's steps as one loop), against SB3's
``TD3.train``.

As for SAC (``test_compiled_sac.py``): run without the compiler, the step function is SB3's step bit for
bit (the target smoothing noise drawn before the call, in SB3's order; actor steps and critic-only steps;
DDPG's one critic; the importance-weighted critic loss against the eager fused one); compiled, it rounds
differently and may stray no further than ``DRIFT`` times PyTorch's single-kernel Adam on the same work; a
one-line change strays beyond it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences
from tests.equivalence.compile_helpers import compiled_loop_run

pytestmark = [pytest.mark.needs("stable_baselines3"), pytest.mark.xdist_group("compiled_td3")]

STEPS, CALLS = 8, 6  # 48 gradient steps
DRIFT = 20.0


def _filled(algo: str = "TD3", seed: int = 3, **kwargs):
    import stable_baselines3

    model = getattr(stable_baselines3, algo)("MlpPolicy", "Pendulum-v1", learning_starts=10_000, seed=seed,
                                             policy_kwargs=dict(net_arch=[64, 64]), **kwargs)
    model.learn(600)
    return model


def _run(model, train) -> dict:
    np.random.seed(11)
    torch.manual_seed(11)
    logged = []
    for _ in range(CALLS):
        train(STEPS, 64)
        logged.append({k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")})
    optimizers = [model.actor.optimizer, model.critic.optimizer]
    return {"parameters": torch.cat([p.detach().flatten() for p in model.policy.parameters()]),
            "steps": [float(s["step"]) for o in optimizers for s in o.state.values()],
            "logged": logged, "n_updates": model._n_updates, "rng": torch.get_rng_state(),
            "numpy": np.random.get_state()[1].copy()}


def _gap(expected: dict, actual: dict) -> float:
    return float((expected["parameters"] - actual["parameters"]).abs().max() / expected["parameters"].abs().max())


def _train(model, **kwargs):
    from rlaccel_sb3.fused import fused_train_for

    return fused_train_for(model, **kwargs)


@pytest.fixture(scope="module")
def runs() -> dict:
    """One compiled graph: every step an actor step (``policy_delay=1``), so CI compiles once."""
    base = _filled(policy_delay=1)
    models = {name: copy.deepcopy(base) for name in ("stock", "single-kernel adam", "compiled", "compiled loop")}
    models["compiled loop"].gradient_steps = STEPS
    return {"stock": _run(models["stock"], models["stock"].train),
            "single-kernel adam": _run(models["single-kernel adam"], _train(models["single-kernel adam"],
                                                                            fused_optimizer=True)),
            "compiled": _run(models["compiled"], _train(models["compiled"], compiled=True)),
            "compiled loop": compiled_loop_run(models["compiled loop"], _run, _train),
            "base": base}



@pytest.mark.parametrize("variant", ["compiled", "compiled loop"])
def test_the_compiled_td3_step_agrees_with_sb3_within_the_derived_tolerance(runs, variant):
    stock, compiled, reference = runs["stock"], runs[variant], runs["single-kernel adam"]
    assert differences(stock["parameters"], compiled["parameters"])  # it compiled: not bit for bit
    assert _gap(stock, compiled) <= DRIFT * max(_gap(stock, reference), 1e-7)
    assert compiled["n_updates"] == stock["n_updates"] and compiled["steps"] == stock["steps"]
    assert torch.equal(compiled["rng"], stock["rng"]) and np.array_equal(compiled["numpy"], stock["numpy"])
    assert differences(stock["logged"], compiled["logged"], rtol=1e-3, atol=1e-6) == []


@pytest.mark.parametrize("loop", [False, True], ids=["one call per step", "one loop per train()"])
@pytest.mark.parametrize(("algo", "kwargs"), [("TD3", {}), ("TD3", dict(policy_delay=3)), ("TD3", dict(policy_delay=4)),
                                              ("DDPG", {})],
                         ids=["TD3", "actor every 3 steps", "actor every 4 steps", "DDPG"])
def test_the_td3_step_run_eagerly_is_sb3s_bit_for_bit(algo, kwargs, loop, monkeypatch, count_loops):
    """With ``loop``, the model's ``gradient_steps`` is each call's: one loop per call where the call is
    a whole number of actor periods (8 steps: ``policy_delay`` 1, 2, 4), one call per step otherwise (3)."""
    from rlaccel_sb3.fused.compiled_td3 import CompiledTD3Step

    from rlaccel_plugins.fused import compiled_step

    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    loops = count_loops(CompiledTD3Step)
    base = _filled(algo, **kwargs)
    stock, ours = copy.deepcopy(base), copy.deepcopy(base)
    if loop:
        stock.gradient_steps = ours.gradient_steps = STEPS
    train = _train(ours, compiled=True)
    assert differences(_run(stock, stock.train), _run(ours, train)) == []
    assert train.graphs.compiled_step is not None  # the compiled step's function ran
    assert loops == ([STEPS] * CALLS if loop and STEPS % ours.policy_delay == 0 else [])


@pytest.mark.parametrize("loop", [False, True], ids=["one call per step", "one loop per train()"])
def test_the_importance_weighted_step_is_the_eager_fused_ones_bit_for_bit(loop, monkeypatch):
    """The tiered buffer's importance weights reach the critics' loss: the compiled step's function
    (uncompiled) against the eager fused step, which applies them as SB3's weight hook does."""
    from rlaccel_sb3 import TieredReplayBuffer

    from rlaccel_plugins.fused import compiled_step

    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    base = _filled(replay_buffer_class=TieredReplayBuffer,
                   replay_buffer_kwargs=dict(level_capacity=[200, 1800], sampling_ratio=[0.6, 0.4], importance_beta=0.5))
    eager, ours = copy.deepcopy(base), copy.deepcopy(base)
    if loop:
        eager.gradient_steps = ours.gradient_steps = STEPS
    train = _train(ours, compiled=True)
    assert differences(_run(eager, _train(eager)), _run(ours, train)) == []
    assert train.graphs.compiled_step is not None


def test_a_one_line_change_to_the_actor_loss_strays_beyond_the_tolerance(runs, monkeypatch):
    from rlaccel_sb3.fused import compiled_td3

    from rlaccel_plugins.fused import compiled_step

    original = compiled_td3.apply_layers

    def changed(kinds, params, x):  # the actor's and critics' layers 0.1% off
        return original(kinds, params, x) * 1.001

    monkeypatch.setattr(compiled_td3, "apply_layers", changed)
    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    model = copy.deepcopy(runs["base"])
    changed_run = _run(model, _train(model, compiled=True))
    assert _gap(runs["stock"], changed_run) > DRIFT * max(_gap(runs["stock"], runs["single-kernel adam"]), 1e-7)
