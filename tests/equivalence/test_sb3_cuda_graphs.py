"""The fused SB3 updates captured in CUDA graphs equal SB3's own ``train()`` on the same GPU.

Runs only where a CUDA device is (``benchmarks/gpu_check.sh`` runs it on the lent GPU machine; CI has
none, and skips it with the reason). Stock vs graphed from the same model, seed and buffer contents:
200 ``train()`` calls of one gradient step (every step's logged losses compared) and 25 calls of 8,
then parameters, optimizer-free state and the numpy RNG.

Tolerance: rtol=1e-4, atol=1e-5 — not bit-for-bit, because a graph needs the fused, capturable Adam
(one kernel for the whole step, rounding differently from the per-tensor kernels SB3's Adam runs);
the random draws (SAC's and TD3's noise) are the same: a graph replay consumes the Philox offsets an
eager step would.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences
from tests.equivalence.test_sb3_fused import _filled

pytestmark = [pytest.mark.needs("stable_baselines3", "sb3_contrib"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")]

RTOL, ATOL = 1e-4, 1e-5


def _calls(model, train, calls: int, steps: int) -> dict:
    np.random.seed(11)
    torch.manual_seed(11)
    logged = []
    for _ in range(calls):
        train(steps, 32)
        logged.append({k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")})
    return {"parameters": dict(model.policy.state_dict()), "logged": logged, "n_updates": model._n_updates,
            "log_ent_coef": getattr(model, "log_ent_coef", None), "numpy_rng": np.random.get_state()[1]}


def _gap(expected, actual) -> float:
    """The largest relative difference of the parameters (printed: the measured figure behind RTOL)."""
    return max(((a - e).abs().max() / e.abs().max().clamp_min(1e-12)).item()
               for e, a in zip(expected["parameters"].values(), actual["parameters"].values())
               if e.is_floating_point())


@pytest.mark.parametrize("algo", ["DQN", "QRDQN", "SAC", "TD3", "DDPG"])
@pytest.mark.parametrize(("calls", "steps"), [(200, 1), (25, 8)])
def test_graphed_train_is_sb3s_train_on_cuda(algo, calls, steps):
    from rlaccel_sb3.fused import fused_train_for

    stock, graphed = _filled(algo, "ReplayBuffer", device="cuda"), _filled(algo, "ReplayBuffer", device="cuda")
    train = fused_train_for(graphed)
    expected, actual = _calls(stock, stock.train, calls, steps), _calls(graphed, train, calls, steps)
    assert train.graphs.steps.enabled, train.graphs.reason
    assert train.graphs.captured >= 1
    print(f"{algo} {calls}x{steps}: max relative parameter gap {_gap(expected, actual):.2e}")
    assert differences(expected, actual, rtol=RTOL, atol=ATOL) == []
    train.release()


def test_graphs_follow_the_sparse_dense_phase_and_skip_nonfinite_steps_on_the_device():
    """One graph per phase; the schedule's counters and the guard's equal SB3 + the host-side guard's;
    a NaN batch is skipped on the device (no host sync) where the host guard skips it. One documented
    difference: a step skipped on the device still advances the sparse/dense schedule (the host would
    need a sync to know), so the poisoned batches come last."""
    from rlaccel_sb3.fused import fused_train_for
    from rlaccel_sb3.networks import trained_networks

    from rlaccel_plugins.updates import SparseDenseUpdater
    from rlaccel_plugins.updates.guard import GradientGuard

    runs = []
    for graphed in (False, True):
        model = _filled("DQN", "ReplayBuffer", device="cuda")
        updater = SparseDenseUpdater(sparse_update_interval=4, dense_layers=[-1])
        guard = GradientGuard(max_grad_norm=0.5)
        for net in trained_networks(model, batch=32):
            guard.attach(net.optimizer)
            updater.attach(net.module, net.optimizer, example_input=net.example_input, name=net.name)
        train = fused_train_for(model, guard=guard) if graphed else model.train
        np.random.seed(5)
        rewards = model.replay_buffer.rewards.copy()
        for call in range(60):
            if call in (58, 59):
                model.replay_buffer.rewards[:] = np.nan  # a poisoned batch: every gradient NaN
            train(1, 32)
            model.replay_buffer.rewards[:] = rewards
        if graphed:
            assert train.graphs.captured >= 2  # a full and a dense graph
            train.release()
        runs.append({"parameters": dict(model.policy.state_dict()), "updater": updater.stats,
                     "guard": dict(guard.stats)})
        updater.detach()
        guard.detach()
    stock, graphed = runs
    assert stock["guard"] == graphed["guard"] and graphed["guard"]["skipped_steps"] == 2
    steps = ("full_updates", "dense_updates")
    assert sum(graphed["updater"][k] for k in steps) == sum(stock["updater"][k] for k in steps) + 2 == 60
    assert differences(stock["parameters"], graphed["parameters"], rtol=RTOL, atol=ATOL) == []


def test_the_callback_runs_graphs_during_learn_and_puts_everything_back():
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=200, train_freq=4, gradient_steps=4, seed=0,
                device="cuda")
    captured = []

    class Spy(AccelerateCallback):
        def _on_rollout_end(self) -> None:
            super()._on_rollout_end()
            graphs = getattr(self.model.__dict__.get("train"), "graphs", None)
            captured.append((self.fused, graphs.captured if graphs is not None else -1))

    callback = Spy(preset="classic_control")
    model.learn(2_000, callback=callback)
    assert all(fused for fused, _ in captured) and max(n for _, n in captured) >= 1
    assert "train" not in model.__dict__
    assert all(not g.get("capturable") and not g.get("fused") for g in model.policy.optimizer.param_groups)
    assert callback.stats["full_updates"] + callback.stats["dense_updates"] == model._n_updates
