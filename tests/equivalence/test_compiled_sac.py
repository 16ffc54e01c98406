"""``training.compiled_updates`` for SAC: the entropy coefficient's, the critics' and the actor's updates
and the Polyak average compiled as one call, against SB3's ``SAC.train``.

As for DQN (``test_compiled_step.py``): run without the compiler, the step function is SB3's step bit for
bit (the two Gaussian draws made before the call, in SB3's order); compiled, it rounds differently, and
the tolerance is derived on the running CPU from how far PyTorch's single-kernel Adam strays on the same
work; a one-line change strays beyond it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences
from tests.equivalence.compile_helpers import compiled_loop_run

pytestmark = [pytest.mark.needs("stable_baselines3"), pytest.mark.xdist_group("compiled_sac")]

STEPS, CALLS = 8, 6  # 48 gradient steps
DRIFT = 20.0


def _filled(seed: int = 3, **kwargs):
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=10_000, seed=seed,
                policy_kwargs=dict(net_arch=[64, 64]), **kwargs)
    model.learn(600)
    return model


def _train(model, compiled: bool):
    from rlaccel_sb3.fused import fused_train_for

    return fused_train_for(model, compiled=compiled)


def _run(model, train) -> dict:
    np.random.seed(11)
    torch.manual_seed(11)
    logged = []
    for _ in range(CALLS):
        train(STEPS, 64)
        logged.append({k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")})
    optimizers = [o for o in (model.actor.optimizer, model.critic.optimizer, model.ent_coef_optimizer) if o]
    return {"parameters": torch.cat([p.detach().flatten() for p in model.policy.parameters()]),
            "log_ent_coef": None if model.log_ent_coef is None else model.log_ent_coef.detach().clone(),
            "steps": [float(s["step"]) for o in optimizers for s in o.state.values()],
            "logged": logged, "n_updates": model._n_updates, "rng": torch.get_rng_state(),
            "numpy": np.random.get_state()[1].copy()}


def _gap(expected: dict, actual: dict) -> float:
    return float((expected["parameters"] - actual["parameters"]).abs().max() / expected["parameters"].abs().max())


@pytest.fixture(scope="module")
def runs() -> dict:
    from rlaccel_sb3.fused import fused_train_for

    base = _filled()
    models = {name: copy.deepcopy(base) for name in ("stock", "single-kernel adam", "compiled", "compiled loop")}
    models["compiled loop"].gradient_steps = STEPS
    return {"stock": _run(models["stock"], models["stock"].train),
            "single-kernel adam": _run(models["single-kernel adam"],
                                       fused_train_for(models["single-kernel adam"], fused_optimizer=True)),
            "compiled": _run(models["compiled"], _train(models["compiled"], compiled=True)),
            "compiled loop": compiled_loop_run(models["compiled loop"], _run, _train),
            "base": base}



@pytest.mark.parametrize("variant", ["compiled", "compiled loop"])
def test_the_compiled_sac_step_agrees_with_sb3_within_the_derived_tolerance(runs, variant):
    stock, compiled, reference = runs["stock"], runs[variant], runs["single-kernel adam"]
    assert differences(stock["parameters"], compiled["parameters"])  # it compiled: not bit for bit
    assert _gap(stock, compiled) <= DRIFT * max(_gap(stock, reference), 1e-7)
    assert compiled["n_updates"] == stock["n_updates"] and compiled["steps"] == stock["steps"]
    assert torch.equal(compiled["rng"], stock["rng"]) and np.array_equal(compiled["numpy"], stock["numpy"])
    assert differences(stock["logged"], compiled["logged"], rtol=1e-3, atol=1e-6) == []


@pytest.mark.parametrize("loop", [False, True], ids=["one call per step", "one loop per train()"])
@pytest.mark.parametrize("kwargs", [{}, dict(ent_coef=0.1), dict(target_update_interval=2),
                                    dict(target_update_interval=16)],
                         ids=["auto entropy", "fixed entropy", "target every 2 steps", "target every 16 steps"])
def test_the_sac_step_run_eagerly_is_sb3s_bit_for_bit(kwargs, loop, monkeypatch, count_loops):
    from rlaccel_sb3.fused.compiled_sac import CompiledSACStep

    from rlaccel_plugins.fused import compiled_step

    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    loops = count_loops(CompiledSACStep)
    base = _filled(**kwargs)
    stock, ours = copy.deepcopy(base), copy.deepcopy(base)
    if loop:
        stock.gradient_steps = ours.gradient_steps = STEPS
    assert differences(_run(stock, stock.train), _run(ours, _train(ours, compiled=True))) == []
    assert loops == ([STEPS] * CALLS if loop else [])


def test_a_one_line_change_to_the_actor_loss_strays_beyond_the_tolerance(runs, monkeypatch):
    from rlaccel_sb3.fused import compiled_sac

    from rlaccel_plugins.fused import compiled_step

    original = compiled_sac._actor_sample

    def changed(latent_kinds, params, observations, noise, epsilon):  # the log-probability 0.1% off
        actions, log_prob = original(latent_kinds, params, observations, noise, epsilon)
        return actions, log_prob * 1.001

    monkeypatch.setattr(compiled_sac, "_actor_sample", changed)
    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    model = copy.deepcopy(runs["base"])
    changed_run = _run(model, _train(model, compiled=True))
    assert _gap(runs["stock"], changed_run) > DRIFT * max(_gap(runs["stock"], runs["single-kernel adam"]), 1e-7)


def test_sac_without_a_compiled_step_says_why():
    from rlaccel_sb3.fused import compiled_unavailable

    assert "gSDE" in compiled_unavailable(_filled(use_sde=True))
    assert compiled_unavailable(_filled()) is None
