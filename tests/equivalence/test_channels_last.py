"""``training.channels_last``: Conv2d layers in channels-last memory format while training, put back after.

Channels-last convolutions sum in another order, so the updates agree with the contiguous ones within a
stated tolerance (not bit for bit), and a one-line change to the loss breaks that agreement.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import UpdateRecorder, differences
from rlaccel_plugins.fused.memory_format import ChannelsLast

# 200 gradient steps of a small NatureCNN DQN stay within this of the contiguous run (measured: within
# rtol 3e-6 / atol 3e-7 but not 1e-6 / 1e-7); a loss change does not
CHANNELS_LAST_TOLERANCE = dict(rtol=3e-5, atol=3e-6)
CHANNELS_LAST = torch.channels_last


class Frames(gym.Env):
    """36x36 single-channel frames (the smallest NatureCNN input); reward 1 when the action says whether
    the frame is bright."""

    observation_space = gym.spaces.Box(0, 255, (1, 36, 36), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _frame(self):
        self.bright = bool(self.np_random.integers(2))
        low = 128 if self.bright else 0
        return self.np_random.integers(low, low + 128, self.observation_space.shape, dtype=np.uint8)

    def step(self, action):
        reward = float(int(action) == int(self.bright))
        self.t += 1
        return self._frame(), reward, False, self.t >= 20, {}


class StackedFrames(Frames):
    """Four stacked frames (a one-channel batch is laid out alike in both formats: nothing to convert)."""

    observation_space = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)


def _dqn(seed: int = 0, policy: str = "CnnPolicy", env: gym.Env | None = None, **kwargs):
    from stable_baselines3 import DQN

    kwargs.setdefault("policy_kwargs", dict(features_extractor_kwargs=dict(features_dim=64)))
    return DQN(policy, env or Frames(), buffer_size=2_000, learning_starts=400, batch_size=32, seed=seed, **kwargs)


def _conv_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in module.modules() if isinstance(m, torch.nn.Conv2d)]


def test_channels_last_converts_every_conv_weight_and_puts_it_back_bit_for_bit():
    conv = torch.nn.Conv2d(4, 8, 3)
    net = torch.nn.Sequential(conv, torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.ReLU(), conv.__class__(8, 4, 1),
                              torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 2))
    twin = torch.nn.ModuleList([net, net[0]])  # a layer reached twice is converted once
    optimizer = torch.optim.Adam(net.parameters())
    x = torch.rand(5, 4, 8, 8)
    net(x).square().sum().backward()
    optimizer.step()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    moments = {k: v.clone() for k, v in optimizer.state[conv.weight].items()}
    expected = net(x)

    layout = ChannelsLast([twin], [optimizer])
    assert layout.layers == 3
    assert all(w.is_contiguous(memory_format=CHANNELS_LAST) and not w.is_contiguous() for w in _conv_weights(net)[:2])
    assert net[4].weight.is_contiguous()  # a 1x1 kernel is laid out alike in both formats: left as it is
    assert optimizer.state[conv.weight]["exp_avg"].is_contiguous(memory_format=CHANNELS_LAST)
    assert conv.weight.grad.is_contiguous(memory_format=CHANNELS_LAST)
    seen = []
    hook = net[2].register_forward_pre_hook(lambda _m, args: seen.append(args[0].is_contiguous(memory_format=CHANNELS_LAST)))
    out = net(x)
    hook.remove()
    assert seen == [True]  # the activations stay in channels-last between the layers
    assert differences(expected, out, rtol=1e-5, atol=1e-6) == []

    layout.remove()
    layout.remove()  # idempotent
    assert all(w.is_contiguous() for w in _conv_weights(net)) and conv.weight.grad.is_contiguous()
    assert all(not m._forward_pre_hooks for m in net.modules())
    assert differences(before, dict(net.state_dict())) == []  # the same values, bit for bit
    assert all(v.is_contiguous() for v in optimizer.state[conv.weight].values())
    assert differences(moments, dict(optimizer.state[conv.weight])) == []


def _filled(seed: int = 3, env: gym.Env | None = None):
    model = _dqn(seed, train_freq=4, env=env)
    model.learning_starts = 10_000
    model.learn(600)
    return model


def _train_200(model, channels_last: bool, train=None, frames: bool = False):
    from rlaccel_sb3.fused import fused_train_for
    from rlaccel_sb3.networks import frame_input_networks

    train = train or fused_train_for(model)
    frame_inputs = frame_input_networks(model.policy) if frames else ()
    layout = ChannelsLast([model.policy], [model.policy.optimizer], frame_inputs) if channels_last else None
    np.random.seed(11)
    torch.manual_seed(11)
    with UpdateRecorder([model.policy.optimizer]) as record:
        for _ in range(25):
            if layout is not None:
                assert all(w.is_contiguous(memory_format=CHANNELS_LAST) for w in _conv_weights(model.policy))
            train(8, 32)
    if layout is not None:
        layout.remove()
    return {"losses": record.losses, "parameters": dict(model.policy.state_dict()),
            "optimizer": model.policy.optimizer.state_dict()["state"]}


def test_channels_last_updates_agree_with_contiguous_ones_within_its_tolerance_and_a_loss_change_breaks_it(monkeypatch):
    import torch.nn.functional as F
    from rlaccel_sb3.fused import value_based

    contiguous, channels_last = _train_200(_filled(), False), _train_200(_filled(), True)
    assert differences(contiguous, channels_last)  # the channels-last kernels ran: not bit-identical
    assert differences(contiguous, channels_last, **CHANNELS_LAST_TOLERANCE) == []

    def huber_with_beta_0_99(model, q_net, observations, actions, target, weights, batch_size):
        current = torch.gather(q_net(observations), dim=1, index=actions.long())
        loss = F.smooth_l1_loss(current, target, beta=0.99)
        return loss, loss

    monkeypatch.setattr(value_based, "_dqn_loss", huber_with_beta_0_99)
    mutated = _train_200(_filled(), True)
    assert differences(contiguous["losses"], mutated["losses"], **CHANNELS_LAST_TOLERANCE)


def test_frames_converted_before_preprocessing_reach_the_convolutions_in_channels_last_with_the_same_results():
    from rlaccel_sb3.networks import frame_input_networks

    model = _filled(env=StackedFrames())
    assert frame_input_networks(model.policy) == [model.policy.q_net, model.policy.q_net_target]
    first_convs = [next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
                   for net in (model.policy.q_net, model.policy.q_net_target)]
    arrivals = []  # registered before ChannelsLast's own hook: what reaches the layer before it converts
    for conv in first_convs:
        conv.register_forward_pre_hook(lambda _m, args: arrivals.append(
            (args[0].dtype, args[0].is_contiguous(memory_format=CHANNELS_LAST))))
    as_frames = _train_200(model, True, frames=True)
    assert arrivals and set(arrivals) == {(torch.float32, True)}  # converted while uint8, floats already laid out
    assert differences(_train_200(_filled(env=StackedFrames()), True), as_frames) == []  # the same values reach them


def test_frame_inputs_are_only_networks_running_sb3s_own_nature_cnn():
    from rlaccel_sb3 import AccelerateCallback
    from rlaccel_sb3.networks import frame_input_networks
    from stable_baselines3 import PPO
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class OwnCnn(BaseFeaturesExtractor):
        def __init__(self, observation_space, features_dim=16):
            super().__init__(observation_space, features_dim)
            self.cnn = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 8, 4), torch.nn.Flatten(), torch.nn.LazyLinear(16))

        def forward(self, observations):
            n = observations.shape[0]  # flattening by view needs PyTorch's default layout of the frames
            return self.cnn(observations.view(n, -1).view(n, 4, 36, 36))

    ppo = PPO("CnnPolicy", Frames(), n_steps=16, batch_size=16, policy_kwargs=dict(features_extractor_kwargs=dict(features_dim=16)))
    assert frame_input_networks(ppo.policy) == [ppo.policy]
    custom = _dqn(env=StackedFrames(), policy_kwargs=dict(features_extractor_class=OwnCnn))
    assert frame_input_networks(custom.policy) == []
    assert frame_input_networks(_dqn(policy="MlpPolicy", policy_kwargs=None).policy) == []
    # its convolution still runs in channels-last, converted at the layer, and the view still works; its
    # LazyLinear is created in the first greedy action's forward, which therefore runs under no_grad, not
    # inference_mode (inference tensors as weights would fail the first gradient step)
    custom.learn(480, callback=AccelerateCallback(preset="classic_control", channels_last=True, sparse=False))
    assert custom.num_timesteps == 480 and custom._n_updates > 0


def _channels_last_hooks(module: torch.nn.Module) -> int:
    from rlaccel_plugins.fused.memory_format import _channels_last_input

    return sum(hook is _channels_last_input for m in module.modules() for hook in m._forward_pre_hooks.values())


@pytest.mark.parametrize("through", ["callback", "accelerate"])
def test_the_callback_trains_in_channels_last_for_learn_only_and_saves_plain_weights(tmp_path, through):
    import rlaccel_sb3
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList

    model = _dqn(train_freq=4, gradient_steps=2)
    seen = []

    class Probe(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps in (450, 700):
                seen.append((all(w.is_contiguous(memory_format=CHANNELS_LAST) for w in _conv_weights(model.policy)),
                             _channels_last_hooks(model.policy)))
                model.save(tmp_path / "during.zip")  # a checkpoint mid-learn
            return True

    if through == "callback":
        accelerated = AccelerateCallback(preset="classic_control", channels_last=True, sparse=False)
    else:
        accelerated = rlaccel_sb3.accelerate(model, preset="classic_control", channels_last=True)
    model.learn(800, callback=CallbackList([accelerated, Probe()]))
    assert seen == [(True, 8), (True, 8)]  # q_net's and q_net_target's three convs and their frame inputs
    assert all(w.is_contiguous() for w in _conv_weights(model.policy)) and _channels_last_hooks(model.policy) == 0
    assert all(v.is_contiguous() for s in model.policy.optimizer.state.values() for v in s.values())
    model.save(tmp_path / "after.zip")
    for name in ("during.zip", "after.zip"):
        loaded = DQN.load(tmp_path / name, env=Frames())
        assert all(w.is_contiguous() for w in _conv_weights(loaded.policy))
        loaded.learn(50)  # loads and trains as a plain SB3 model


def test_channels_last_leaves_an_mlp_policy_as_it_is():
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4, seed=0)
    callback = AccelerateCallback(preset="classic_control", channels_last=True, sparse=False)
    model.learn(300, callback=callback)
    assert all(p.is_contiguous() for p in model.policy.parameters())


class ConvQ(torch.nn.Module):
    """A small Atari-style Q-network with Tianshou's ``forward(obs, state, info)``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 8, 4), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 4, 2),
                                       torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64 * 3 * 3, 2))

    def forward(self, obs, state=None, info=None):
        return self.net(torch.as_tensor(obs, dtype=torch.float32) / 255.0), state


def _tianshou_run(channels_last: bool, buffer, nudge: bool = False):
    import copy

    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.torch_utils import policy_within_training_step

    from rlaccel_plugins.loader import load_config

    torch.manual_seed(0)
    policy = DiscreteQLearningPolicy(model=ConvQ(), action_space=Frames.action_space)
    if nudge:  # every weight one float step up: a rounding-sized difference at the start
        with torch.no_grad():
            for weight in policy.parameters():
                weight.copy_(torch.nextafter(weight, torch.full_like(weight, float("inf"))))
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, target_update_freq=20)
    wrapper = SparseDenseWrapper(algorithm, config=load_config(preset="classic_control", channels_last=channels_last))
    buffer, formats = copy.deepcopy(buffer), []
    with policy_within_training_step(wrapper.policy):
        for _ in range(100):
            wrapper.update(buffer, 32)
            formats.append(all(w.is_contiguous(memory_format=CHANNELS_LAST) for w in _conv_weights(algorithm)))
    wrapper.detach()
    return wrapper, {"parameters": dict(algorithm.state_dict()),
                     "optimizer": algorithm.optim._optim.state_dict()["state"]}, formats


def test_the_tianshou_wrapper_trains_in_channels_last_until_detach_within_its_tolerance():
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    buffer, envs = VectorReplayBuffer(2_000, 2), DummyVectorEnv([Frames for _ in range(2)])
    envs.seed(0)
    filler = DQN(policy=DiscreteQLearningPolicy(model=ConvQ(), action_space=Frames.action_space),
                 optim=AdamOptimizerFactory())
    Collector(filler, envs, buffer).collect(n_step=600, random=True, reset_before_collect=True)

    _, contiguous, _ = _tianshou_run(False, buffer)
    _, nudged, _ = _tianshou_run(False, buffer, nudge=True)
    wrapper, channels_last, formats = _tianshou_run(True, buffer)
    assert len(formats) == 100 and all(formats)  # every update ran with the weights in channels-last
    assert all(w.is_contiguous() for w in _conv_weights(wrapper.wrapped_algorithm))  # detach() put them back
    assert _channels_last_hooks(wrapper.wrapped_algorithm) == 0
    assert differences(contiguous, channels_last)  # the channels-last kernels ran
    # The tolerance is derived on this CPU, not fixed: summing in another order is a rounding-sized change at
    # every step, and 100 updates grow such a change as they grow any other. So each tensor may be as far from
    # the contiguous run as a run whose weights started one float step away is (measured: 0.03-1.7x of it),
    # with a factor of 10 for the two growing differently; a change to the math is orders beyond that.
    rounding, gaps = _max_gaps(contiguous, nudged), _max_gaps(contiguous, channels_last)
    assert any(rounding.values())
    beyond = {name: (gaps[name], rounding[name]) for name in gaps
              if gaps[name] > 10 * rounding[name] + torch.finfo(torch.float32).eps * _largest(contiguous, name)}
    assert not beyond, f"beyond 10x the rounding-sized spread (channels-last gap, spread): {beyond}"


def _flat(state, prefix=""):
    if isinstance(state, dict):
        for key, value in state.items():
            yield from _flat(value, f"{prefix}/{key}")
    elif torch.is_tensor(state):
        yield prefix, state.detach().double()


def _max_gaps(a, b) -> dict[str, float]:
    """The largest elementwise |a - b| of every tensor in two (nested) state dicts."""
    right = dict(_flat(b))
    return {name: (value - right[name]).abs().max().item() for name, value in _flat(a)}


def _largest(state, name: str) -> float:
    return dict(_flat(state))[name].abs().max().item()


def test_a_deep_copy_of_a_channels_last_wrapper_detaches_its_own_layers_only():
    import copy

    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory

    from rlaccel_plugins.loader import load_config

    algorithm = DQN(policy=DiscreteQLearningPolicy(model=ConvQ(), action_space=Frames.action_space),
                    optim=AdamOptimizerFactory())
    wrapper = SparseDenseWrapper(algorithm, config=load_config(preset="classic_control", channels_last=True))
    twin = copy.deepcopy(wrapper)
    twin.detach()
    assert _channels_last_hooks(twin.wrapped_algorithm) == 0
    assert all(w.is_contiguous() for w in _conv_weights(twin.wrapped_algorithm))
    assert _channels_last_hooks(algorithm) == 2  # the original's two layers untouched
    assert all(w.is_contiguous(memory_format=CHANNELS_LAST) for w in _conv_weights(algorithm))
    wrapper.detach()
    assert _channels_last_hooks(algorithm) == 0 and all(w.is_contiguous() for w in _conv_weights(algorithm))
