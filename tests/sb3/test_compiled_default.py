"""``compiled_updates: auto`` (the default) and the thread policy, as a user of the README's two lines meets
them: which update runs is decided from the model and the ``learn()`` call alone, so a seeded run is the
same run whatever the compiled-step cache holds and however many threads the machine leaves it."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.needs("stable_baselines3"), pytest.mark.xdist_group("compiled")]


def _model(**kwargs):
    from stable_baselines3 import DQN

    # the shapes of tests/equivalence/test_compiled_step.py's loop: one compilation serves both
    settings = dict(learning_starts=100, train_freq=16, gradient_steps=8, batch_size=32, seed=0,
                    policy_kwargs=dict(net_arch=[64, 64]))
    return DQN("MlpPolicy", "CartPole-v1", **{**settings, **kwargs})


def _learned(total: int, **callback_kwargs):
    from rlaccel_sb3 import AccelerateCallback

    model, callback = _model(), AccelerateCallback(**callback_kwargs)
    model.learn(total, callback=callback)
    return torch.cat([p.detach().flatten() for p in model.policy.parameters()]), callback


def test_a_short_learn_runs_the_eager_step_bit_for_bit():
    from rlaccel_sb3.fused import planned_gradient_steps

    assert planned_gradient_steps(_model(), 1_000) < 5_000  # below DQN's break-even
    auto, callback = _learned(1_000)
    eager, _ = _learned(1_000, compiled_updates=False)
    assert callback.update_path == "fused" and not callback.compiled
    assert torch.equal(auto, eager)


def test_a_long_learn_compiles_and_is_the_same_run_whatever_the_cache_holds(monkeypatch, tmp_path):
    from rlaccel_sb3.fused import planned_gradient_steps

    from rlaccel_plugins.fused import compiled_cache, compiled_step

    assert planned_gradient_steps(_model(), 10_200) >= 5_000
    monkeypatch.setenv("RLACCEL_CACHE_DIR", str(tmp_path))  # empty: this process compiles
    monkeypatch.setattr(compiled_cache, "_IN_PROCESS", {})
    monkeypatch.setattr(compiled_step, "_COMPILED", {})
    compiled, callback = _learned(10_200)
    assert callback.update_path == "compiled"
    monkeypatch.setattr(compiled_cache, "_IN_PROCESS", {})  # a new process: the cache holds the step now
    monkeypatch.setattr(compiled_step, "_COMPILED", {})
    loaded, callback = _learned(10_200)
    events = [event for call in compiled_step._COMPILED.values() for event, _ in call.events]
    assert callback.update_path == "compiled" and events == ["loaded"]
    assert torch.equal(compiled, loaded)


def test_the_thread_count_changes_no_result_and_comes_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one, callback = _learned(1_500, config=_threads(1))
        two, _ = _learned(1_500, config=_threads(2))
        assert torch.equal(one, two)
        assert callback.threads.fixed == 1 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _threads(count: int):
    from rlaccel_plugins.loader import load_config

    return load_config(num_threads=count)


def test_on_policy_calls_count_their_minibatch_steps_and_only_checked_families_compile():
    from rlaccel_sb3.fused import compiled_pays, planned_gradient_steps
    from stable_baselines3 import A2C, PPO

    ppo = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=5)  # 10 steps per rollout
    assert planned_gradient_steps(ppo, 12_800) == 2_000 and compiled_pays(ppo, 12_800)
    assert planned_gradient_steps(ppo, 12_799) == 2_000  # SB3 collects a last rollout past the total
    assert not compiled_pays(ppo, 12_800 - 64)
    a2c = A2C("MlpPolicy", "CartPole-v1")  # a compiled step, but no learning check yet: eager under auto
    assert planned_gradient_steps(a2c, 100_000) == 20_000 and not compiled_pays(a2c, 100_000)


@pytest.mark.parametrize("algo", ["TD3", "DDPG", "QRDQN"])
def test_checked_families_compile_from_their_break_even(algo):
    """TD3 (and DDPG, which runs TD3's update) and QR-DQN passed their learning check: ``auto`` compiles a
    call that plans their break-even, 2,500 gradient steps, and no shorter one."""
    import sb3_contrib
    import stable_baselines3
    from rlaccel_sb3.fused import break_even, compiled_pays, planned_gradient_steps

    cls = getattr(stable_baselines3, algo, None) or getattr(sb3_contrib, algo)
    model = cls("MlpPolicy", "CartPole-v1" if algo == "QRDQN" else "Pendulum-v1", learning_starts=100)
    assert break_even(model) == 2_500
    threshold = 100 + 2_500 * model.train_freq.frequency // model.gradient_steps
    assert planned_gradient_steps(model, threshold) >= 2_500 and compiled_pays(model, threshold)
    assert not compiled_pays(model, threshold - 2 * model.train_freq.frequency)
