"""Flat optimizer steps (``rlaccel_plugins.fused.flat_optim``): PyTorch's own Adam/AdamW/RMSprop step, bit for
bit, in fewer ops."""

from __future__ import annotations

import copy
import functools
import io

import pytest
import torch

from rlaccel_plugins.fused import flat_optim
from rlaccel_plugins.fused.flat_optim import optimizer_step
from rlaccel_plugins.updates.guard import GradientGuard


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 3))


def _backward(net: torch.nn.Module, step: int) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step)) * 3
    (net(x) ** 2).mean().backward()


def _same(a: torch.nn.Module, b: torch.nn.Module, oa: torch.optim.Optimizer, ob: torch.optim.Optimizer) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["state"].keys() == sb["state"].keys()
    for key, state in sa["state"].items():
        assert state.keys() == sb["state"][key].keys()
        for name, value in state.items():
            assert torch.equal(value, sb["state"][key][name]), (key, name)


def _pair(make, seed: int = 0):
    ours, theirs = _net(seed), _net(seed)
    return ours, theirs, make(ours.parameters()), make(theirs.parameters())


def _step_both(ours, theirs, oa, ob, step: int) -> None:
    """One step of the same data: ``oa`` through the flat step, ``ob`` through its own; then compared."""
    for net, optimizer in ((ours, oa), (theirs, ob)):
        optimizer.zero_grad()
        _backward(net, step)
    optimizer_step(oa)
    ob.step()
    _same(ours, theirs, oa, ob)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=3e-3),
    lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True, betas=(0.8, 0.99), eps=1e-6),
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05),
    lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=0.01, decoupled_weight_decay=True),
    lambda p: torch.optim.RMSprop(p, lr=7e-4, alpha=0.99, eps=1e-5, weight_decay=0),  # SB3's A2C
    lambda p: torch.optim.RMSprop(p, lr=1e-2, weight_decay=0.1),
], ids=["default", "foreach-betas-eps", "weight-decay", "adamw", "decoupled", "rmsprop-a2c", "rmsprop-weight-decay"])
def test_the_flat_step_is_pytorchs_bit_for_bit(make):
    ours, theirs, oa, ob = _pair(make)
    for step in range(60):
        if step == 30:  # SB3 sets the learning rate before every train() call
            for group in (*oa.param_groups, *ob.param_groups):
                group["lr"] *= 0.5
        _step_both(ours, theirs, oa, ob, step)
    assert flat_optim._LAYOUTS.get(oa), "the flat step did not run"


def test_the_comparison_sees_a_last_bit_change():
    """The bit-for-bit check is not blind to rounding: a learning rate one float32 step off is caught."""
    import numpy as np

    ours, theirs, oa, ob = _pair(lambda p: torch.optim.Adam(p, lr=float(np.float32(1e-2))))
    oa.param_groups[0]["lr"] = float(np.nextafter(np.float32(1e-2), np.float32(1.0)))
    with pytest.raises(AssertionError):
        for step in range(5):
            _step_both(ours, theirs, oa, ob, step)


@pytest.mark.parametrize("kind", ["Adam", "RMSprop"])
def test_parameters_that_skip_steps_keep_their_own_step_counts_as_in_pytorch(monkeypatch, kind):
    """Sparse/dense: the first layer gets no gradient on most steps, so its step count and bias
    corrections differ from the others'; a parameter never stepped has no state, as in PyTorch."""
    def run():
        ours, theirs, oa, ob = _pair(lambda p: getattr(torch.optim, kind)(p, lr=1e-2))
        for step in range(40):
            frozen = step % 5 != 0
            for net in (ours, theirs):
                net[0].weight.requires_grad_(not frozen)
                net[0].bias.requires_grad_(not frozen)
            for net, optimizer in ((ours, oa), (theirs, ob)):
                optimizer.zero_grad()
                _backward(net, step)
            for net in (ours, theirs):
                net[2].bias.grad = None if step < 7 else net[2].bias.grad  # stepped only from step 7
            optimizer_step(oa)
            ob.step()
            _same(ours, theirs, oa, ob)
    run()
    if kind == "RMSprop":  # no bias correction: the runs split only where a parameter has no gradient
        return
    # the runs of equal step counts matter: one bias correction for every parameter breaks it
    runs = flat_optim._runs
    monkeypatch.setattr(flat_optim, "_runs", lambda stepped, counts: runs(stepped, [1.0] * len(counts)))
    with pytest.raises(AssertionError):
        run()


def test_state_saved_and_loaded_goes_on_as_pytorchs_and_loads_into_a_stock_adam():
    ours, theirs, oa, ob = _pair(lambda p: torch.optim.Adam(p, lr=1e-2))
    for step in range(10):
        _step_both(ours, theirs, oa, ob, step)
    saved = io.BytesIO()
    torch.save(oa.state_dict(), saved)
    saved.seek(0)
    stock = torch.optim.Adam(theirs.parameters(), lr=1e-2)
    stock.load_state_dict(torch.load(saved))
    twin = copy.deepcopy(ours)
    reloaded = torch.optim.Adam(twin.parameters(), lr=1e-2)
    reloaded.load_state_dict(copy.deepcopy(oa.state_dict()))  # state from elsewhere: copied into the buffers on the next step
    for step in range(10, 20):
        for net, optimizer in ((ours, oa), (theirs, stock), (twin, reloaded)):
            optimizer.zero_grad()
            _backward(net, step)
        optimizer_step(oa)
        stock.step()
        optimizer_step(reloaded)
        _same(ours, theirs, oa, stock)
        _same(twin, theirs, reloaded, stock)
    oa.load_state_dict(copy.deepcopy(stock.state_dict()))  # a load into an optimizer already stepped flat
    _step_both(ours, theirs, oa, stock, 99)


@pytest.mark.parametrize("max_grad_norm", [0.5, None])
def test_the_guard_checks_before_the_flat_step_and_post_hooks_run(max_grad_norm):
    """A clipping guard clips first; a check-only one reads the flat gradient buffer's norm (and the
    guard's own norm where a parameter has no gradient, step 5). Non-finite steps are skipped alike."""
    ours, theirs, oa, ob = _pair(lambda p: torch.optim.Adam(p, lr=1e-2))
    guards = [GradientGuard(max_grad_norm=max_grad_norm), GradientGuard(max_grad_norm=max_grad_norm)]
    guards[0].attach(oa)
    guards[1].attach(ob)
    seen = []
    oa.register_step_post_hook(lambda optimizer, args, kwargs: seen.append(optimizer))
    for step in range(8):
        for net, optimizer in ((ours, oa), (theirs, ob)):
            optimizer.zero_grad()
            _backward(net, step)
            if step == 3:
                net[0].weight.grad[0, 0] = float("nan")
            if step == 6:
                net[2].bias.grad[0] = float("inf")
            if step == 5:
                net[0].bias.grad = None
        optimizer_step(oa)
        ob.step()
        _same(ours, theirs, oa, ob)
    assert guards[0].stats == guards[1].stats and guards[0].stats["skipped_steps"] == 2
    assert (guards[0].stats["clipped_steps"] > 0) == (max_grad_norm is not None) and seen == [oa] * 6
    assert flat_optim._LAYOUTS.get(oa)


@pytest.mark.parametrize("case", ["amsgrad", "maximize", "lr-scheduler", "pre-hook", "sgd", "restore-last-good",
                                  "rmsprop-momentum", "rmsprop-centered"])
def test_what_the_flat_step_does_not_cover_runs_the_optimizers_own_step(case):
    net = _net()
    if case.startswith("rmsprop"):
        optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-2, momentum=0.9 if case == "rmsprop-momentum" else 0,
                                        centered=case == "rmsprop-centered")
    else:
        optimizer = (torch.optim.SGD(net.parameters(), lr=0.1) if case == "sgd" else
                     torch.optim.Adam(net.parameters(), amsgrad=case == "amsgrad", maximize=case == "maximize"))
    if case == "lr-scheduler":
        torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    if case == "pre-hook":
        optimizer.register_step_pre_hook(lambda *args: None)
    if case == "restore-last-good":
        GradientGuard(restore_last_good=True).attach(optimizer)
    twin = copy.deepcopy(net)
    stock = type(optimizer)(twin.parameters(), **{k: v for k, v in optimizer.defaults.items()})
    for step in range(3):
        for n, o in ((net, optimizer), (twin, stock)):
            o.zero_grad()
            _backward(n, step)
        optimizer_step(optimizer)
        stock.step()
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), twin.parameters()))
    assert not flat_optim._LAYOUTS.get(optimizer)


def test_zero_grad_is_the_optimizers_and_defers_to_its_own_override(monkeypatch):
    from rlaccel_plugins.fused import zero_grad

    net = _net()
    optimizer = torch.optim.Adam(net.parameters())
    net(torch.ones(3, 4)).sum().backward()
    zero_grad(optimizer)
    assert all(p.grad is None for p in net.parameters()) and hasattr(optimizer, "_zero_grad_profile_name")

    class KeepsZeros(torch.optim.SGD):  # an override (set_to_none=False) must run, not ours
        def zero_grad(self, set_to_none: bool = False) -> None:
            super().zero_grad(set_to_none=False)

    for own in (KeepsZeros(net.parameters(), lr=0.1), torch.optim.SGD(net.parameters(), lr=0.1)):
        if type(own) is torch.optim.SGD:
            own.zero_grad = functools.partial(torch.optim.Optimizer.zero_grad, own, set_to_none=False)
        net(torch.ones(3, 4)).sum().backward()
        zero_grad(own)
        assert all(p.grad is not None and not p.grad.any() for p in net.parameters())


def test_plain_steps_hand_every_step_to_pytorch_and_end_with_the_block():
    net = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(net.parameters(), foreach=True)
    net(torch.ones(3, 4)).sum().backward()
    with flat_optim.plain_steps():
        optimizer_step(optimizer)
    assert optimizer not in flat_optim._LAYOUTS  # PyTorch's own step: no flat buffers made
    optimizer_step(optimizer)
    assert optimizer in flat_optim._LAYOUTS
