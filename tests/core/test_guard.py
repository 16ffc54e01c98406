"""GradientGuard: non-finite steps are skipped, counted and logged; clipping; real SB3/Tianshou training."""

import pytest
import torch

import rlaccel_plugins as rla
from rlaccel_plugins.updates.guard import GradientGuard


def _nan_every(module, calls):
    """Make the module's output NaN on the given forward calls (counted while training)."""
    seen = {"n": 0}

    def hook(mod, args, output):
        if torch.is_grad_enabled():
            seen["n"] += 1
            if seen["n"] in calls:
                if isinstance(output, tuple):  # Tianshou nets return (values, hidden state)
                    return (output[0] * float("nan"), *output[1:])
                return output * float("nan")
        return output

    return module.register_forward_hook(hook)


def test_guard_skips_non_finite_steps_and_clips_the_rest():
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    guard = GradientGuard(max_grad_norm=0.5)
    guard.attach(opt)
    guard.attach(opt)  # idempotent
    for step in range(6):
        opt.zero_grad()
        x = torch.full((4, 3), float("inf") if step == 2 else 10.0)
        before = [p.detach().clone() for p in net.parameters()]
        net(x).pow(2).sum().backward()
        opt.step()
        moved = any(not torch.equal(b, p) for b, p in zip(before, net.parameters()))
        assert moved == (step != 2)
        assert all(torch.isfinite(p).all() for p in net.parameters())
    assert guard.stats == {"skipped_steps": 1, "clipped_steps": 5, "guarded_steps": 6, "restored_steps": 0}
    assert opt.state_dict()["state"][0]["step"] == 5  # Adam's state never saw the bad step
    guard.detach()
    assert "step" not in opt.__dict__


def test_guard_from_config():
    assert GradientGuard.from_config(rla.load_config(skip_nonfinite=False)) is None
    guard = GradientGuard.from_config(rla.load_config(max_grad_norm=1.0))
    assert guard.max_grad_norm == 1.0 and guard.skip_nonfinite


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_sb3_training_survives_injected_nans_and_logs_the_skips(caplog):
    from rlaccel_sb3 import SparseDenseCallback, TieredReplayBuffer
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import configure

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=200, train_freq=4, batch_size=32, seed=0,
                replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="classic_control"),
                policy_kwargs=dict(net_arch=[32, 32]))
    model.set_logger(configure(None, ["csv"]))
    records = {}
    model.logger.record = lambda key, value, exclude=None: records.__setitem__(key, value)
    handle = _nan_every(model.q_net, calls={5, 6, 40})
    callback = SparseDenseCallback(preset="classic_control")
    with caplog.at_level("WARNING", logger="rlaccel"):
        model.learn(1_000, callback=callback)
    handle.remove()
    assert model.num_timesteps >= 1_000
    assert callback.stats["skipped_steps"] == 3
    assert callback.stats["guarded_steps"] == model._n_updates
    assert all(torch.isfinite(p).all() for p in model.q_net.parameters())
    assert records["rlaccel/skipped_steps"] == 3
    assert sum("non-finite gradient norm" in r.message for r in caplog.records) == 3


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_tianshou_training_survives_injected_nans():
    import gymnasium as gym
    from rlaccel_tianshou import SparseDenseWrapper, TieredVectorReplayBuffer
    from tianshou.algorithm import DQN
    from tianshou.algorithm.algorithm_base import policy_within_training_step
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net

    env = gym.make("CartPole-v1")
    net = Net(state_shape=4, action_shape=2, hidden_sizes=[32, 32])
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_training=0.5)
    algorithm = SparseDenseWrapper(DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3)), preset="classic_control")
    buffer = TieredVectorReplayBuffer(2_000, 2, preset="classic_control")
    collector = Collector(algorithm, DummyVectorEnv([lambda: gym.make("CartPole-v1")] * 2), buffer,
                          exploration_noise=True)
    collector.reset()
    collector.collect(n_step=256)
    handle = _nan_every(net, calls={8, 15})  # the first update also traces the net (3 calls)
    with policy_within_training_step(policy):
        for _ in range(20):
            stats = algorithm.update(sample_size=32, buffer=buffer)
    handle.remove()
    assert algorithm.guard.stats["skipped_steps"] == 2
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert stats.rlaccel_skipped_steps == 2.0


def test_restore_last_good_undoes_a_step_that_made_the_weights_non_finite():
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=1e38)  # finite gradients, but an update that overflows
    guard = GradientGuard(restore_last_good=True)
    guard.attach(opt)
    before = [p.detach().clone() for p in net.parameters()]
    net(torch.full((1, 2), 1e3)).sum().backward()
    opt.step()
    assert guard.stats["restored_steps"] == 1 and guard.stats["skipped_steps"] == 0
    assert all(torch.equal(b, p) for b, p in zip(before, net.parameters()))
    assert GradientGuard.from_config(rla.load_config(skip_nonfinite=False, restore_last_good=True)) is not None


@pytest.mark.parametrize("dtypes", [(torch.float32,), (torch.float32, torch.float64)], ids=["one-group", "mixed"])
def test_the_guards_norm_and_clip_are_torchs_bit_for_bit(dtypes):
    """The guard's and the fused updates' norm skips torch's per-call grouping; the result must not move."""
    from rlaccel_plugins.fused.kernels import clip_grad_norm, total_norm

    torch.manual_seed(0)
    shapes = [(256, 17), (256,), (256, 256), (256,), (1, 256), (1,)]
    params = [torch.nn.Parameter(torch.randn(s, dtype=dtypes[i % len(dtypes)])) for i, s in enumerate(shapes)]
    for p in params[:-1]:  # the last one has no gradient, as a frozen layer in a sparse step
        p.grad = torch.randn_like(p) * 3
    grads = [p.grad for p in params if p.grad is not None]
    assert torch.equal(total_norm(grads), torch.nn.utils.get_total_norm(grads))
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, p in zip(copies, params):
        c.grad = None if p.grad is None else p.grad.clone()
    ours, theirs = clip_grad_norm(params, 1.0), torch.nn.utils.clip_grad_norm_(copies, 1.0)
    assert torch.equal(ours, theirs)
    assert all(torch.equal(p.grad, c.grad) for p, c in zip(params[:-1], copies[:-1])) and params[-1].grad is None


def test_the_study_guards_code_state_follows_python_edits_in_a_real_git_checkout(tmp_path):
    import shutil
    import subprocess

    from rlaccel_plugins.bench.report import code_state

    if shutil.which("git") is None:
        pytest.skip("needs git")

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "results.md").write_text("first\n")
    git("add", ".")
    git("commit", "-qm", "first")
    clean = code_state(tmp_path)
    assert clean.startswith("python sources ") and "uncommitted" not in clean
    (tmp_path / "results.md").write_text("second\n")
    git("commit", "-qam", "results only")
    assert code_state(tmp_path) == clean  # a commit that only adds results leaves it as it is
    (tmp_path / "model.py").write_text("x = 2\n")
    edited = code_state(tmp_path)
    assert edited != clean and edited.endswith("(with uncommitted edits)")
    git("add", "model.py")  # staged, not committed: still an edit
    staged = code_state(tmp_path)
    assert staged != clean and staged.endswith("(with uncommitted edits)")
    git("commit", "-qm", "code")
    committed = code_state(tmp_path)
    assert committed not in (clean, edited) and "uncommitted" not in committed
    assert code_state(tmp_path / "nowhere") is None  # not a checkout
