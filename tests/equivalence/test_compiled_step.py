"""``training.compiled_updates``: a DQN gradient step compiled whole (TorchInductor) against SB3's own.

The compiled step rounds differently from the eager one (inductor sums the bias gradients and norms in
another order, eager's Adam kernels use fused multiply-adds), so it is not bit for bit. The tolerance is
derived on the running CPU: after 200 steps the compiled run may stray from SB3's no further than
``DRIFT`` times as far as PyTorch's own single-kernel Adam (``training.fused_optimizer``, another
re-rounding of the same math) strays on the same work; a one-line change to the loss strays far beyond.
The same function run eagerly is SB3's step bit for bit: the math is the same, only the rounding moves.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences

pytestmark = [pytest.mark.needs("stable_baselines3"), pytest.mark.xdist_group("compiled")]

STEPS, CALLS = 8, 25  # 200 gradient steps
DRIFT = 20.0  # how much farther than the single-kernel Adam's re-rounding the compiled run may stray


def _filled(seed: int = 3):
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=10_000, seed=seed, policy_kwargs=dict(net_arch=[64, 64]))
    model.learn(1_500)
    return model


def _run(model, train) -> dict:
    np.random.seed(11)
    logged = []
    for _ in range(CALLS):
        train(STEPS, 32)
        logged.append(model.logger.name_to_value["train/loss"])
    optimizer = model.policy.optimizer
    return {"parameters": torch.cat([p.detach().flatten() for p in model.q_net.parameters()]),
            "exp_avg_sq": torch.cat([optimizer.state[p]["exp_avg_sq"].flatten() for p in model.q_net.parameters()]),
            "steps": [float(optimizer.state[p]["step"]) for p in model.q_net.parameters()],
            "logged": logged, "n_updates": model._n_updates, "rng": np.random.get_state()[1].copy()}


def _gap(expected: dict, actual: dict) -> float:
    """The largest parameter difference relative to the parameters' scale."""
    return float((expected["parameters"] - actual["parameters"]).abs().max() / expected["parameters"].abs().max())


@pytest.fixture(scope="module")
def runs() -> dict:
    """SB3's own, the single-kernel Adam's and the compiled runs of the same work: one compiled call per
    step (``gradient_steps=1`` in the model: how SB3's default DQN trains), and one compiled loop per
    ``train()`` call (``gradient_steps`` as many as the call's: how RL Zoo's does)."""
    from rlaccel_sb3.fused import fused_train_for

    base = _filled()
    models = {name: copy.deepcopy(base) for name in ("stock", "single-kernel adam", "compiled", "compiled loop")}
    models["compiled loop"].gradient_steps = STEPS
    return {"stock": _run(models["stock"], models["stock"].train),
            "single-kernel adam": _run(models["single-kernel adam"],
                                       fused_train_for(models["single-kernel adam"], fused_optimizer=True)),
            "compiled": _run(models["compiled"], fused_train_for(models["compiled"], compiled=True)),
            "compiled loop": _run(models["compiled loop"], fused_train_for(models["compiled loop"], compiled=True)),
            "base": base}


@pytest.mark.parametrize("variant", ["compiled", "compiled loop"])
def test_the_compiled_step_agrees_with_sb3_within_the_derived_tolerance(runs, variant):
    stock, compiled, reference = runs["stock"], runs[variant], runs["single-kernel adam"]
    assert differences(stock["parameters"], compiled["parameters"])  # it compiled: not bit for bit
    assert _gap(stock, compiled) <= DRIFT * max(_gap(stock, reference), 1e-7)
    # what does not depend on rounding is equal: the update count, Adam's step counts, every RNG draw
    assert compiled["n_updates"] == stock["n_updates"]
    assert compiled["steps"] == stock["steps"]
    assert np.array_equal(compiled["rng"], stock["rng"])
    assert differences(stock["logged"], compiled["logged"], rtol=1e-4) == []


def test_a_one_line_change_to_the_loss_strays_beyond_the_tolerance(runs, monkeypatch):
    """Run without the compiler (the same function: a compilation of a changed loss would cost CI seconds)."""
    import torch.nn.functional as F
    from rlaccel_sb3.fused import fused_train_for, value_based

    from rlaccel_plugins.fused import compiled_step

    def huber_with_beta_0_99(params, kinds, target_params, observations, actions, next_observations, rewards, dones,
                             discounts, weights=None):  # one changed argument
        from rlaccel_plugins.fused.flat import apply_layers

        with torch.no_grad():
            next_q = apply_layers(kinds, target_params, next_observations.float()).max(dim=1).values.reshape(-1, 1)
            target = rewards + (1 - dones) * discounts * next_q
        current = torch.gather(apply_layers(kinds, params, observations.float()), dim=1, index=actions.long())
        loss = F.smooth_l1_loss(current, target, beta=0.99)
        return loss, loss.detach()

    monkeypatch.setattr(value_based, "_dqn_compiled_loss", huber_with_beta_0_99)
    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    model = copy.deepcopy(runs["base"])
    changed = _run(model, fused_train_for(model, compiled=True))
    assert _gap(runs["stock"], changed) > DRIFT * max(_gap(runs["stock"], runs["single-kernel adam"]), 1e-7)


def test_the_step_run_eagerly_is_sb3s_step_bit_for_bit():
    """The compiled function's math, without the compiler: one step equals SB3's (clip, Adam, state)."""
    from rlaccel_sb3.fused.value_based import compiled_dqn_step

    model = _filled()
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    obs, actions, next_obs = torch.randn(32, 4), torch.randint(0, 2, (32, 1)), torch.randn(32, 4)
    rewards, dones = torch.rand(32, 1), (torch.rand(32, 1) < 0.1).float()
    for _ in range(3):
        compiled_dqn_step(ours, compile=False)(obs, actions, next_obs, rewards, dones, ours.gamma)
        optimizer = theirs.policy.optimizer
        optimizer.zero_grad()
        with torch.no_grad():
            next_q = theirs.q_net_target(next_obs).max(dim=1).values.reshape(-1, 1)
            target = rewards + (1 - dones) * theirs.gamma * next_q
        loss = torch.nn.functional.smooth_l1_loss(theirs.q_net(obs).gather(1, actions), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.policy.parameters(), theirs.max_grad_norm)
        optimizer.step()
    assert differences(dict(theirs.policy.state_dict()), dict(ours.policy.state_dict())) == []
    assert differences(theirs.policy.optimizer.state_dict()["state"], ours.policy.optimizer.state_dict()["state"]) == []


def test_a_non_finite_step_is_skipped_and_counted_in_the_graph():
    from rlaccel_sb3.fused.value_based import compiled_dqn_step

    from rlaccel_plugins.updates.guard import GradientGuard

    model = _filled()
    guard = GradientGuard()
    guard.attach(model.policy.optimizer)
    step = compiled_dqn_step(model, compile=False)
    before = copy.deepcopy(model.policy.state_dict())
    step(torch.full((32, 4), float("nan")), torch.zeros(32, 1, dtype=torch.long), torch.zeros(32, 4),
         torch.zeros(32, 1), torch.zeros(32, 1), 0.99)
    step.flush()
    assert differences(dict(before), dict(model.policy.state_dict())) == []
    assert guard.stats["skipped_steps"] == 1 and guard.stats["guarded_steps"] == 1
    guard.detach()


def test_where_a_compiled_step_cannot_run_the_reason_is_named():
    from rlaccel_sb3.fused import compiled_unavailable
    from stable_baselines3 import DQN

    sgd = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_class=torch.optim.SGD))
    assert "SGD" in compiled_unavailable(sgd)
    amsgrad = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_kwargs=dict(amsgrad=True)))
    assert "amsgrad" in compiled_unavailable(amsgrad)
    from stable_baselines3 import A2C, PPO

    class OwnDQN(DQN):
        def train(self, gradient_steps: int, batch_size: int = 100) -> None:
            super().train(gradient_steps, batch_size)

    assert "no compiled step" in compiled_unavailable(OwnDQN("MlpPolicy", "CartPole-v1"))
    assert "gSDE" in compiled_unavailable(PPO("MlpPolicy", "Pendulum-v1", use_sde=True))
    momentum = dict(optimizer_class=torch.optim.RMSprop, optimizer_kwargs=dict(momentum=0.9))
    assert "momentum" in compiled_unavailable(A2C("MlpPolicy", "CartPole-v1", policy_kwargs=momentum))
    assert compiled_unavailable(PPO("MlpPolicy", "CartPole-v1")) is None
    assert compiled_unavailable(A2C("MlpPolicy", "CartPole-v1")) is None
    assert compiled_unavailable(DQN("MlpPolicy", "CartPole-v1")) is None


def test_compiled_updates_true_refuses_a_model_it_cannot_compile():
    import rlaccel_sb3
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import PPO

    from rlaccel_plugins.errors import ConfigError

    model = PPO("MlpPolicy", "Pendulum-v1", use_sde=True, n_steps=16, batch_size=16)
    fix = r"Fix: compiled_updates='auto' \(in YAML, compiled_updates: auto\)"
    with pytest.raises(ConfigError, match=r"compiled_updates must be 'auto' or False.*gSDE.*" + fix):
        model.learn(16, callback=AccelerateCallback(compiled_updates=True))
    with pytest.raises(ConfigError, match="gSDE"):  # accelerate() knows the model: it refuses at once
        rlaccel_sb3.accelerate(model, compiled_updates=True)


def test_the_drop_in_works_on_a_policy_the_user_compiled():
    """A user who already ran ``Module.compile()`` on the policy's networks: the drop-in (eager fused and
    compiled steps) trains it, and the eager drop-in gives the same weights as on the uncompiled policy
    (its flat networks read the same parameters)."""
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN

    def trained(user_compiled: bool, compiled_updates: bool) -> torch.Tensor:
        model = DQN("MlpPolicy", "CartPole-v1", learning_starts=200, train_freq=64, gradient_steps=8, seed=0,
                    policy_kwargs=dict(net_arch=[64, 64]))
        if user_compiled:
            for network in model.policy.children():
                network.compile()
        model.learn(600, callback=AccelerateCallback(compiled_updates=compiled_updates))
        assert model._n_updates == 56  # (600 - 200) // 64 + 1 train() calls of 8 steps
        return torch.cat([p.detach().flatten() for p in model.q_net.parameters()])

    assert torch.equal(trained(True, False), trained(False, False))
    assert torch.isfinite(trained(True, True)).all()


def test_where_the_compiler_fails_one_warning_then_the_same_step_eagerly(monkeypatch):
    from rlaccel_sb3.fused import fused_train_for

    from rlaccel_plugins.errors import RlaccelWarning
    from rlaccel_plugins.fused import compiled_step

    def broken_compiler(function):
        def fails(*args):
            raise RuntimeError("no C++ compiler found")
        return fails

    monkeypatch.setattr(compiled_step, "_compiled", broken_compiler)
    base = _filled()
    fallback, eager = copy.deepcopy(base), copy.deepcopy(base)
    with pytest.warns(RlaccelWarning, match="torch.compile failed .*no C\\+\\+ compiler found") as caught:
        fallback_run = _run(fallback, fused_train_for(fallback, compiled=True))
    assert len(caught) == 1
    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    assert differences(_run(eager, fused_train_for(eager, compiled=True)), fallback_run) == []
