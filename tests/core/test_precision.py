"""Mixed precision on the update path: bf16/fp16 autocast, fp16 loss scaling, real SB3 and Tianshou runs.

Whether bf16/fp16 learn CartPole as well as fp32 is measured by `rlaccel bench --suite precision`
(README, "Mixed precision"), not asserted here: a unit test asserts the mechanism.
"""

import pytest
import torch

import rlaccel_plugins as rla
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.updates.guard import GradientGuard
from rlaccel_plugins.updates.loss_scale import LossScaler
from rlaccel_plugins.updates.precision import update_autocast


def _grads(net, dtype, guard=None, scale=1e-4):
    torch.manual_seed(1)
    x, y = torch.randn(64, 4) * scale, torch.randn(64, 2) * scale
    net.zero_grad()
    with update_autocast(dtype, "cpu", guard):
        torch.nn.functional.mse_loss(net(x), y).backward()
    return net[0].weight.grad.clone()  # the first layer's: products of two tiny factors


def test_loss_scaling_recovers_the_gradients_that_fp16_underflows():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    reference = _grads(net, "fp32")
    with torch.autocast("cpu", dtype=torch.float16):  # fp16 without a scaler: gradients of 1e-8 vanish
        net.zero_grad()
        torch.manual_seed(1)
        x, y = torch.randn(64, 4) * 1e-4, torch.randn(64, 2) * 1e-4
        torch.nn.functional.mse_loss(net(x), y).backward()
    unscaled = net[0].weight.grad.clone()
    scaled = _grads(net, "fp16", GradientGuard(loss_scaler=LossScaler()))

    def error(g):
        return float((g - reference).norm() / reference.norm())

    assert error(unscaled) > 0.1     # quantised to fp16's subnormals, many flushed to zero
    assert error(scaled) < 0.01
    assert torch.Tensor.backward.__name__ == "backward"  # the patch is gone after the update


def test_an_overflowing_fp16_step_is_skipped_and_the_scale_backs_off_then_grows():
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    scaler = LossScaler(init_scale=2.0 ** 16, growth_interval=3)
    guard = GradientGuard(loss_scaler=scaler)
    guard.attach(opt)
    for value, moves, scale_after in ((1e3, False, 2.0 ** 15),  # 1e3 * 2**16 overflows fp16
                                      (1e-2, True, 2.0 ** 15), (1e-2, True, 2.0 ** 15), (1e-2, True, 2.0 ** 16)):
        before = net.weight.detach().clone()
        opt.zero_grad()
        with update_autocast("fp16", "cpu", guard):
            net(torch.full((1, 2), value)).pow(2).sum().backward()
        opt.step()
        assert (not torch.equal(before, net.weight)) == moves
        assert scaler.scale == scale_after
    assert guard.stats["skipped_steps"] == 1 and guard.stats["loss_scale"] == 2.0 ** 16
    restored = LossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.scale == scaler.scale


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_optimizer_step_inside_one_update_context_sees_the_weights_the_last_one_wrote(dtype):
    """Regression: autocast's weight cache kept the first step's half-precision weights for the whole
    update (SB3's train() takes many steps in one call), and bf16/fp16 DQN never learned CartPole."""
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    guard = GradientGuard.from_config(rla.load_config(dtype=dtype))
    guard.attach(opt)
    x = torch.full((1, 4), 0.5)
    with update_autocast(dtype, "cpu", guard):
        outputs = []
        for _ in range(3):
            opt.zero_grad()
            out = net(x)
            outputs.append(float(out))
            (0.25 * out.float()).sum().backward()
            opt.step()
    assert guard.stats["skipped_steps"] == 0
    # each SGD step lowers the output by lr * 0.25 * (|x|^2 + 1) = 0.5
    assert outputs[0] - outputs[1] == pytest.approx(0.5, rel=0.02)
    assert outputs[1] - outputs[2] == pytest.approx(0.5, rel=0.02)


def test_fp16_without_a_loss_scaler_or_without_skipping_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="fp16.*needs loss scaling.*Fix"):
        update_autocast("fp16", "cpu")
    with pytest.raises(ConfigError, match="skip_nonfinite must be true with dtype='fp16'.*Fix"):
        rla.load_config(dtype="fp16", skip_nonfinite=False)
    assert GradientGuard.from_config(rla.load_config(dtype="fp16", skip_nonfinite=True)).loss_scaler is not None
    assert GradientGuard.from_config(rla.load_config(dtype="bf16")).loss_scaler is None


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
@pytest.mark.parametrize("dtype,half", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_sb3_runs_the_update_path_only_in_half_precision_and_keeps_fp32_weights(dtype, half):
    from rlaccel_sb3 import SparseDenseCallback
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4, batch_size=32, seed=0,
                policy_kwargs=dict(net_arch=[32, 32]))
    seen = []
    model.q_net.register_forward_hook(lambda m, a, out: seen.append((torch.is_grad_enabled(), out.dtype)))
    callback = SparseDenseCallback(config=rla.load_config(preset="classic_control", dtype=dtype))
    model.learn(600, callback=callback)
    assert (True, half) in seen                             # gradient steps ran under autocast
    assert (False, torch.float32) in seen                   # acting stayed fp32
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.q_net.parameters())
    assert "train" not in model.__dict__                    # the wrapper is removed after learn()
    assert torch.Tensor.backward.__name__ == "backward"
    if dtype == "fp16":
        assert callback.stats["loss_scale"] > 0 and callback.stats["guarded_steps"] == model._n_updates


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_fp16_sac_unscales_every_gradient_including_the_entropy_coefficients_own_optimizer():
    """SAC's entropy-coefficient optimizer is not one rlaccel schedules; its gradient is unscaled too
    (Adam would hide a 65536x gradient, so the gradient itself is compared, not the result)."""
    from rlaccel_sb3 import SparseDenseCallback
    from stable_baselines3 import SAC

    def last_entropy_gradient(dtype):
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=64, batch_size=32, seed=0,
                    policy_kwargs=dict(net_arch=[32, 32]))
        model.learn(150, callback=SparseDenseCallback(config=rla.load_config(dtype=dtype, sparse_update_interval=1)))
        return abs(float(model.log_ent_coef.grad))

    assert last_entropy_gradient("fp16") == pytest.approx(last_entropy_gradient("fp32"), rel=0.2)


@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_tianshou_trains_with_fp16_loss_scaling(tmp_path):
    from rlaccel_plugins.training import TrainSpec, run_training

    config = rla.load_config(preset="classic_control", dtype="fp16", parallel_envs=2, batch_size=32)
    result = run_training(TrainSpec(framework="tianshou", algo="dqn", env_id="CartPole-v1", config=config,
                                    steps=1_500, seed=0, eval_freq=10_000, progress=False,
                                    logdir=str(tmp_path)))
    assert result.stats["loss_scale"] > 0
    assert result.stats["guarded_steps"] > 100


def test_tianshou_q_values_reach_the_loss_in_fp32_while_the_network_runs_in_bf16():
    """Tianshou casts its n-step returns to the Q-values' dtype (`to_torch_as`): bf16 Q-values would round
    the targets to 3 significant digits (measured: bf16 DQN needed 26k env steps for 475 instead of 6k)."""
    import gymnasium as gym
    import numpy as np
    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Batch
    from tianshou.utils.net.common import Net

    net = Net(state_shape=4, action_shape=2, hidden_sizes=[32, 32])
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.make("CartPole-v1").action_space)
    algorithm = SparseDenseWrapper(DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3)),
                                   config=rla.load_config(dtype="bf16"))
    batch = Batch(obs=np.ones((3, 4), np.float32), info={})
    with algorithm._autocast():
        assert net(torch.ones(3, 4))[0].dtype == torch.bfloat16     # the matmuls run in bf16
        assert policy(batch).logits.dtype == torch.float32          # what the loss sees
    assert not policy._forward_hooks                                 # nothing left behind


@pytest.mark.needs("stable_baselines3")
def test_the_fp16_loss_scale_goes_on_across_learn_calls_and_checkpoints():
    from rlaccel_sb3 import SparseDenseCallback
    from stable_baselines3 import DQN

    config = rla.load_config(preset="classic_control", dtype="fp16")
    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=50, train_freq=4, batch_size=32, seed=0,
                policy_kwargs=dict(net_arch=[16]))
    callback = SparseDenseCallback(config=config)
    model.learn(200, callback=callback)
    state = callback.state_dict()  # what a checkpoint stores
    steps = state["guard"]["stats"]["guarded_steps"]
    assert steps > 0 and state["guard"]["loss_scale"]["scale"] > 0
    state["guard"]["loss_scale"]["scale"] = 1024.0  # as if overflows had backed it off
    resumed = SparseDenseCallback(config=config)
    resumed.load_state_dict(state)
    model.learn(100, callback=resumed, reset_num_timesteps=False)
    after = resumed.state_dict()["guard"]
    assert after["loss_scale"]["scale"] == 1024.0 and after["stats"]["guarded_steps"] > steps  # went on
    model.learn(100, callback=resumed, reset_num_timesteps=False)  # and across learn() calls
    assert resumed.state_dict()["guard"]["stats"]["guarded_steps"] > after["stats"]["guarded_steps"]
    assert resumed.state_dict()["guard"]["loss_scale"]["scale"] == 1024.0


@pytest.mark.needs("tianshou")
def test_the_tianshou_wrapper_carries_the_fp16_loss_scale_in_its_state_dict():
    import gymnasium as gym
    from rlaccel_tianshou import SparseDenseWrapper, unwrap_state_dict
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    def wrapper():
        policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[16]),
                                         action_space=gym.spaces.Discrete(2))
        return SparseDenseWrapper(DQN(policy=policy, optim=AdamOptimizerFactory()),
                                  config=rla.load_config(preset="classic_control", dtype="fp16"))

    first = wrapper()
    first.guard.loss_scaler.scale = 512.0
    second = wrapper()
    second.load_state_dict(first.state_dict())
    assert second.guard.loss_scaler.scale == 512.0
    assert not any(k.startswith("_rlaccel") for k in unwrap_state_dict(first.state_dict()))
