"""A compiled step on a PyTorch that changed, and compiled steps kept on disk.

Each private API a compiled step uses is taken away in turn: the step is not made, one warning says why,
and training goes on with the eager fused step — bit for bit the run that never tried. The DQN loop's
Python branch (what runs where the loop is not compiled) is SB3's ``train()`` bit for bit. A step saved by
one model is loaded by the next instead of compiled, and computes what the freshly compiled one computes.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences
from rlaccel_plugins.fused.torch_support import COMPILE_APIS

pytestmark = [pytest.mark.needs("stable_baselines3"), pytest.mark.xdist_group("compiled")]

STEPS, CALLS = 8, 25  # the shapes of test_compiled_step.py's runs: one compilation serves both files


def _filled(seed: int = 3, gradient_steps: int = 1):
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=10_000, seed=seed, gradient_steps=gradient_steps,
                policy_kwargs=dict(net_arch=[64, 64]))
    model.learn(1_500)
    return model


def _run(model, train, calls: int = CALLS) -> dict:
    np.random.seed(11)
    for _ in range(calls):
        train(STEPS, 32)
    optimizer = model.policy.optimizer
    return {"parameters": torch.cat([p.detach().flatten() for p in model.q_net.parameters()]),
            "exp_avg": torch.cat([optimizer.state[p]["exp_avg"].flatten() for p in model.q_net.parameters()]),
            "n_updates": model._n_updates, "rng": np.random.get_state()[1].copy()}


def _absent(monkeypatch, api: str) -> None:
    """Make the probe find ``api`` missing, or changed, as a future PyTorch might have it (torch's own code
    keeps its names, so the eager step still runs)."""
    from rlaccel_plugins.fused import torch_support

    if api == "instance hooks":
        monkeypatch.setattr(torch_support, "INSTANCE_HOOKS", ("_optimizer_step_pre_hooks", "_step_post_hooks_renamed"))
    elif api == "changed":  # there, but not what the code expects
        monkeypatch.setitem(torch_support.COMPILE_APIS, "global_post_hooks",
                            ("torch.optim.optimizer:Optimizer", lambda value: isinstance(value, dict)))
    else:
        where, expected = torch_support.COMPILE_APIS[api]
        monkeypatch.setitem(torch_support.COMPILE_APIS, api, (where + "_gone", expected))


@pytest.fixture
def probe_again():
    from rlaccel_plugins.fused import torch_support

    torch_support.reset()
    yield
    torch_support.reset()


@pytest.mark.parametrize("api", [*COMPILE_APIS, "instance hooks", "changed"])
def test_without_a_private_api_training_goes_on_eagerly_after_one_warning(api, monkeypatch, probe_again):
    from rlaccel_sb3.fused import fused_train_for

    from rlaccel_plugins.errors import RlaccelWarning

    base = _filled()
    eager = copy.deepcopy(base)
    expected = _run(eager, fused_train_for(eager), calls=3)  # the eager fused step, never asked to compile
    _absent(monkeypatch, api)
    model = copy.deepcopy(base)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train = fused_train_for(model, compiled=True)
        actual = _run(model, train, calls=3)
        fused_train_for(copy.deepcopy(base), compiled=True)(STEPS, 32)  # another model: no second warning
    ours = [w for w in caught if issubclass(w.category, RlaccelWarning)]
    assert len(ours) == 1 and "compiled updates are off" in str(ours[0].message)
    assert "lacks or changed" in str(ours[0].message)
    assert train.graphs.compiled  # it was asked for, and not made
    assert differences(expected, actual) == []


def test_the_loops_python_branch_is_sb3s_train_bit_for_bit(monkeypatch):
    """``gradient_steps`` steps per ``train()`` call, the loop run without the compiler: what runs where
    the loop's compilation failed."""
    from rlaccel_sb3.fused import fused_train_for

    from rlaccel_plugins.fused import compiled_step

    monkeypatch.setattr(compiled_step, "_compiled", lambda function: function)
    called = []
    monkeypatch.setattr(compiled_step, "adam_scan_", _counting(compiled_step.adam_scan_, called))
    base = _filled(gradient_steps=STEPS)
    stock, looped = copy.deepcopy(base), copy.deepcopy(base)
    expected = _run(stock, stock.train, calls=5)
    actual = _run(looped, fused_train_for(looped, compiled=True), calls=5)
    assert len(called) == 5  # one loop per train() call
    assert differences(expected, actual) == []


def _counting(function, calls: list):
    def counted(*args):
        calls.append(len(args[3][0]))
        return function(*args)
    return counted


def test_a_saved_step_is_loaded_by_the_next_model_and_computes_the_same(monkeypatch, tmp_path):
    from rlaccel_sb3.fused import fused_train_for

    from rlaccel_plugins.fused import compiled_cache, compiled_step

    base = _filled(gradient_steps=STEPS)
    first = copy.deepcopy(base)
    compiled = _run(first, fused_train_for(first, compiled=True), calls=3)
    assert any(compiled_cache.cache_dir().glob("*.bin"))
    # a new process: nothing compiled in memory, the folder as the first left it
    monkeypatch.setattr(compiled_cache, "_IN_PROCESS", {})
    monkeypatch.setattr(compiled_step, "_COMPILED", {})
    second = copy.deepcopy(base)
    train = fused_train_for(second, compiled=True)
    loaded = _run(second, train, calls=3)
    events = [event for call in compiled_step._COMPILED.values() for event, _ in call.events]
    assert events == ["loaded"]
    assert differences(compiled, loaded) == []


def test_a_damaged_saved_step_is_compiled_anew(monkeypatch):
    from rlaccel_sb3.fused import fused_train_for

    from rlaccel_plugins.fused import compiled_cache, compiled_step

    base = _filled(gradient_steps=STEPS)
    first = copy.deepcopy(base)
    expected = _run(first, fused_train_for(first, compiled=True), calls=2)
    for path in compiled_cache.cache_dir().glob("*.bin"):
        path.write_bytes(path.read_bytes()[:1000])  # cut short, as a full disk would leave it
    monkeypatch.setattr(compiled_cache, "_IN_PROCESS", {})
    monkeypatch.setattr(compiled_step, "_COMPILED", {})
    second = copy.deepcopy(base)
    actual = _run(second, fused_train_for(second, compiled=True), calls=2)
    events = [event for call in compiled_step._COMPILED.values() for event, _ in call.events]
    assert events == ["compiled"]
    assert differences(expected, actual) == []


def test_the_key_names_what_the_code_depends_on():
    from rlaccel_plugins.fused.compiled_cache import artifact_key

    def loss(x):
        return x

    base = artifact_key(loss, (torch.zeros(2, 3), 0.99, (0.9, 0.999)), {"cpp_wrapper": True})
    assert base == artifact_key(loss, (torch.ones(2, 3), 0.99, (0.9, 0.999)), {"cpp_wrapper": True})
    assert base != artifact_key(loss, (torch.zeros(3, 3), 0.99, (0.9, 0.999)), {"cpp_wrapper": True})
    assert base != artifact_key(loss, (torch.zeros(2, 3).t(), 0.99, (0.9, 0.999)), {"cpp_wrapper": True})
    assert base != artifact_key(loss, (torch.zeros(2, 3), 0.98, (0.9, 0.999)), {"cpp_wrapper": True})
    assert base != artifact_key(loss, (torch.zeros(2, 3), 0.99, (0.9, 0.999)), {"cpp_wrapper": False})
    assert base != artifact_key(torch.add, (torch.zeros(2, 3), 0.99, (0.9, 0.999)), {"cpp_wrapper": True})


def test_where_compiled_code_cannot_be_kept_each_process_compiles_its_own(monkeypatch, probe_again):
    from rlaccel_plugins.fused import compiled_cache, compiled_step, torch_support

    monkeypatch.setattr(torch_support, "PERSIST_APIS", (*torch_support.PERSIST_APIS, "torch.compiler:gone"))
    monkeypatch.setattr(compiled_step, "_COMPILED", {})
    assert "torch.compiler.gone" in torch_support.persist_unsupported()
    assert not isinstance(compiled_step._compiled(compiled_step.adam_scan_), compiled_cache.PersistedCompile)


def test_loops_of_two_lengths_get_code_of_their_own():
    """AOTAutograd's cache once handed the loop compiled for 8 steps to a call of 16 in a later compilation
    (it then failed with "expected size 16==8" and fell back, with a warning the suite turns into an error)."""
    from rlaccel_sb3.fused import fused_train_for

    from rlaccel_plugins.fused import compiled_cache

    for gradient_steps in (STEPS, 2 * STEPS):
        compiled_cache._IN_PROCESS.clear()  # as in a new process
        model = _filled(gradient_steps=gradient_steps)
        train = fused_train_for(model, compiled=True)
        train(gradient_steps, 32)
        assert train.graphs.compiled_step is not None and train.graphs.compiled_step.failed is None
        assert model._n_updates == gradient_steps
