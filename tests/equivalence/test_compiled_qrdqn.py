"""A compiled QR-DQN gradient step (``compiled_updates=True``; ``auto`` leaves QR-DQN eager until its
learning check runs) against sb3-contrib's ``QRDQN.train``: the DQN loop with the quantile Huber loss.

As for DQN: run without the compiler, the step function is sb3-contrib's step bit for bit (the loop's
Python branch included, and the importance-weighted loss against the eager fused one); compiled, it may
stray from sb3-contrib's run no further than ``DRIFT`` times as far as PyTorch's single-kernel Adam does
on the same work, and a one-line change to the loss strays beyond that.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences

pytestmark = [pytest.mark.needs("sb3_contrib"), pytest.mark.xdist_group("compiled_qrdqn")]

STEPS, CALLS = 8, 12  # 96 gradient steps
DRIFT = 20.0


def _filled(seed: int = 3):
    from sb3_contrib import QRDQN

    model = QRDQN("MlpPolicy", "CartPole-v1", learning_starts=10_000, seed=seed, gradient_steps=STEPS,
                  policy_kwargs=dict(net_arch=[64, 64], n_quantiles=10))
    model.learn(1_500)
    return model


def _run(model, train) -> dict:
    np.random.seed(11)
    for _ in range(CALLS):
        train(STEPS, 32)
    optimizer = model.policy.optimizer
    parameters = list(model.quantile_net.parameters())
    return {"parameters": torch.cat([p.detach().flatten() for p in parameters]),
            "exp_avg_sq": torch.cat([optimizer.state[p]["exp_avg_sq"].flatten() for p in parameters]),
            "n_updates": model._n_updates, "rng": np.random.get_state()[1].copy()}


def _gap(expected: dict, actual: dict) -> float:
    return float((expected["parameters"] - actual["parameters"]).abs().max() / expected["parameters"].abs().max())


@pytest.fixture(scope="module")
def runs() -> dict:
    from rlaccel_sb3.fused import fused_train_for

    base = _filled()
    models = {name: copy.deepcopy(base) for name in ("stock", "single-kernel adam", "compiled")}
    return {"stock": _run(models["stock"], models["stock"].train),
            "single-kernel adam": _run(models["single-kernel adam"],
                                       fused_train_for(models["single-kernel adam"], fused_optimizer=True)),
            "compiled": _run(models["compiled"], fused_train_for(models["compiled"], compiled=True)),
            "base": base}


def test_the_compiled_loop_agrees_with_sb3_contrib_within_the_derived_tolerance(runs):
    stock, compiled, reference = runs["stock"], runs["compiled"], runs["single-kernel adam"]
    assert differences(stock["parameters"], compiled["parameters"])  # it compiled: not bit for bit
    assert _gap(stock, compiled) <= DRIFT * max(_gap(stock, reference), 1e-7)
    assert compiled["n_updates"] == stock["n_updates"] and np.array_equal(compiled["rng"], stock["rng"])


def test_run_without_the_compiler_it_is_sb3_contribs_train_bit_for_bit(runs, monkeypatch):
    from rlaccel_sb3.fused import fused_train_for

    from rlaccel_plugins.fused import compiled_step

    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    model = copy.deepcopy(runs["base"])
    train = fused_train_for(model, compiled=True)
    assert differences(runs["stock"], _run(model, train)) == []
    assert train.graphs.compiled_step is not None  # the compiled step's function ran, not the eager path


def test_a_one_line_change_to_the_loss_strays_beyond_the_tolerance(runs, monkeypatch):
    from rlaccel_sb3.fused import fused_train_for, value_based

    from rlaccel_plugins.fused import compiled_step

    loss_of = value_based._qrdqn_compiled_loss

    def quantile_loss_with_kappa_0_9(params, kinds, shape, target_params, observations, *inputs):
        loss, logged = loss_of(params, kinds, shape, target_params, observations, *inputs)
        return loss * 0.9, logged  # one changed constant

    monkeypatch.setattr(value_based, "_qrdqn_compiled_loss", quantile_loss_with_kappa_0_9)
    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    model = copy.deepcopy(runs["base"])
    changed = _run(model, fused_train_for(model, compiled=True))
    assert _gap(runs["stock"], changed) > DRIFT * max(_gap(runs["stock"], runs["single-kernel adam"]), 1e-7)


def test_the_importance_weighted_step_is_the_eager_weighted_step_bit_for_bit(runs):
    """The tiered buffer's importance weights: the compiled step's function (uncompiled) against the eager
    fused loss with the same weights, then sb3-contrib's clip and Adam."""
    from rlaccel_sb3.fused.value_based import _qrdqn_loss, _qrdqn_targets, compiled_qrdqn_step

    ours, theirs = copy.deepcopy(runs["base"]), copy.deepcopy(runs["base"])
    generator = torch.Generator().manual_seed(0)
    obs, next_obs = torch.randn(32, 4, generator=generator), torch.randn(32, 4, generator=generator)
    actions = torch.randint(0, 2, (32, 1), generator=generator)
    rewards, dones = torch.rand(32, 1, generator=generator), (torch.rand(32, 1, generator=generator) < 0.1).float()
    weights = torch.rand(32, generator=generator)
    step = compiled_qrdqn_step(ours, compile=False)
    for _ in range(3):
        step(obs, actions, next_obs, rewards, dones, ours.gamma, weights)
        batches = _Chunk(next_obs, rewards, dones)
        with torch.no_grad():
            target = _qrdqn_targets(theirs, batches, theirs.gamma, 1, 32)[0]
        _, weighted = _qrdqn_loss(theirs, theirs.quantile_net, obs, actions, target, weights, 32)
        theirs.policy.optimizer.zero_grad()
        weighted.backward()
        if theirs.max_grad_norm is not None:  # sb3-contrib's QR-DQN clips only where it is set
            torch.nn.utils.clip_grad_norm_(theirs.policy.parameters(), theirs.max_grad_norm)
        theirs.policy.optimizer.step()
    assert differences(dict(theirs.policy.state_dict()), dict(ours.policy.state_dict())) == []


class _Chunk:
    """The fields of a chunk of one step that the eager targets read."""

    def __init__(self, next_observations, rewards, dones) -> None:
        self.next_observations, self.rewards, self.dones = next_observations[None], rewards[None], dones[None]
