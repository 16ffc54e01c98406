import copy

import numpy as np
import pytest
import torch
from torch import nn

import rlaccel_plugins as rla
from rlaccel_plugins.errors import ConfigError, RlaccelWarning
from rlaccel_plugins.presets import ARTICLE_SCHEDULE
from rlaccel_plugins.updates import discover_layers


# ------------------------------------------------------------------ networks the design names
class NatureQ(nn.Module):
    """The NatureCNN Q-network (Mnih et al. 2015), as SB3's DQN CnnPolicy builds it."""

    def __init__(self, actions: int = 6) -> None:
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                                 nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten())
        self.linear = nn.Sequential(nn.Linear(3136, 512), nn.ReLU())
        self.q = nn.Linear(512, actions)

    def forward(self, x):
        return self.q(self.linear(self.cnn(x.float() / 255.0)))


class TwinCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qf0 = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
        self.qf1 = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, obs, act):
        x = torch.cat([obs, act], dim=1)
        return self.qf0(x), self.qf1(x)  # executed in order: qf0's layers all run before qf1's


class Dueling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.value, self.advantage = nn.Linear(16, 1), nn.Linear(16, 2)

    def forward(self, x):
        h = self.trunk(x)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=1, keepdim=True)


class ActorCritic(nn.Module):
    """PPO-style: the value head is registered last, but both heads are "last"; a bare log_std."""

    def __init__(self) -> None:
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.vf = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.action_net, self.value_net = nn.Linear(16, 2), nn.Linear(16, 1)
        self.log_std = nn.Parameter(torch.zeros(2))

    def forward(self, obs):
        mean = self.action_net(self.pi(obs))
        return mean + self.log_std.exp(), self.value_net(self.vf(obs))


def test_last_layers_follow_the_autograd_graph_per_branch():
    assert discover_layers(NatureQ(), torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).depths == (
        ("q",), ("linear.0",), ("cnn.4",), ("cnn.2",), ("cnn.0",))
    assert discover_layers(TwinCritic(), (torch.zeros(2, 3), torch.zeros(2, 1))).depths == (
        ("qf0.4", "qf1.4"), ("qf0.2", "qf1.2"), ("qf0.0", "qf1.0"))
    assert discover_layers(Dueling(), torch.zeros(2, 4)).depths == (
        ("advantage", "value"), ("trunk.2",), ("trunk.0",))
    layers = discover_layers(ActorCritic(), torch.zeros(2, 3))
    assert layers.depths == (("action_net", "log_std", "value_net"), ("pi.2", "vf.2"), ("pi.0", "vf.0"))


def test_tracing_has_no_side_effects():
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 2))
    net.train()
    stats = net[1].running_mean.clone()
    example, opt = torch.randn(8, 4), torch.optim.SGD(net.parameters(), 0.1)
    torch.manual_seed(0)
    expected_next = torch.rand(3)
    torch.manual_seed(0)
    rla.SparseDenseUpdater(dense_layers=[-1]).attach(net, opt, example)
    assert torch.equal(torch.rand(3), expected_next)                 # global RNG untouched
    assert torch.equal(net[1].running_mean, stats) and net.training  # BN stats and mode untouched
    assert all(p.grad is None for p in net.parameters())


# ------------------------------------------------------------------ frozen means frozen
def _train_step(net, opt, rng):
    opt.zero_grad()
    x = torch.from_numpy(rng.standard_normal((16, 4)).astype(np.float32))
    net(x).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-3),
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
], ids=["sgd", "adam", "adamw"])
def test_frozen_params_and_optimizer_state_are_bit_identical_over_dense_steps(make_opt):
    torch.manual_seed(0)
    net = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(4, 4), nn.Tanh())], nn.Linear(4, 1))
    opt = make_opt(net.parameters())
    upd = rla.SparseDenseUpdater(sparse_update_interval=100, dense_layers=[-2, -1])
    att = upd.attach(net, opt, example_input=torch.zeros(1, 4))
    frozen_ids = {id(p) for p in att.frozen}
    assert len(att.frozen) == 6 and len(att.dense) == 4  # 3 trunk layers frozen, last 2 dense
    rng = np.random.default_rng(0)
    _train_step(net, opt, rng)  # step 0: full
    before = copy.deepcopy((net.state_dict(), opt.state_dict()))
    for _ in range(99):        # steps 1..99: dense
        dense_before = [p.detach().clone() for p in att.dense]
        _train_step(net, opt, rng)
        assert all(not torch.equal(a, p) for a, p in zip(dense_before, att.dense))  # dense layers move every step
    after_dense = (net.state_dict(), opt.state_dict())
    for name, p in net.named_parameters():
        if id(p) in frozen_ids:
            assert torch.equal(before[0][name], after_dense[0][name]), name
            assert p.grad is None
    for i, p in enumerate(net.parameters()):
        if id(p) in frozen_ids and i in before[1]["state"]:
            for key, value in before[1]["state"][i].items():
                if key != "step":
                    assert torch.equal(value, after_dense[1]["state"][i][key]), (i, key)
    _train_step(net, opt, rng)  # step 100: full again
    assert any(not torch.equal(before[0][n], p) for n, p in net.named_parameters() if id(p) in frozen_ids)
    assert upd.stats["full_updates"] == 2 and upd.stats["dense_updates"] == 99


def test_detach_restores_flags_and_attach_is_idempotent():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1))
    net[0].bias.requires_grad_(False)  # the user's own freeze is kept
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    upd = rla.SparseDenseUpdater(sparse_update_interval=10, dense_layers=[-1])
    a1 = upd.attach(net, opt, torch.zeros(1, 4))
    assert upd.attach(net, opt, torch.zeros(1, 4)) is a1 and len(upd.attachments) == 1
    rng = np.random.default_rng(0)
    for _ in range(3):
        _train_step(net, opt, rng)
    assert upd.stats["full_updates"] + upd.stats["dense_updates"] == 3  # one hook, counted once
    assert not net[0].weight.requires_grad
    upd.detach()
    upd.detach()
    assert [p.requires_grad for p in net.parameters()] == [True, False, True, True, True, True]
    _train_step(net, opt, rng)
    assert upd.stats["full_updates"] + upd.stats["dense_updates"] == 0  # detached: no hooks, no attachments


def test_state_dict_resumes_in_the_same_phase():
    def run(steps, state=None):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        upd = rla.SparseDenseUpdater(sparse_update_interval=5, dense_layers=[-1])
        if state:
            upd.load_state_dict(state)  # before attach: applied when the pair is attached
        upd.attach(net, opt, torch.zeros(1, 4))
        rng = np.random.default_rng(0)
        for _ in range(steps):
            _train_step(net, opt, rng)
        return upd

    first = run(7)
    assert not first.next_step_is_full()                   # step 7 of period 5: dense
    resumed = run(3, first.state_dict())                   # steps 7, 8, 9 dense; 10 full next
    assert resumed.next_step_is_full()
    assert resumed.stats["full_updates"] == 2 and resumed.stats["dense_updates"] == 8


def test_a_state_loaded_before_attach_is_saved_again_as_loaded():
    upd = rla.SparseDenseUpdater(sparse_update_interval=5, dense_layers=[-1])
    state = {"sparse_update_interval": 5,
             "attachments": [{"name": "q", "steps": 7, "full_updates": 2, "dense_updates": 5}]}
    upd.load_state_dict(state)
    assert upd.state_dict() == state  # a checkpoint written before the first update keeps the counters


# ------------------------------------------------------------------ counters
def test_flop_counters_measure_the_saving_on_a_nature_cnn():
    net = NatureQ()
    upd = rla.SparseDenseUpdater.from_config(rla.load_config(preset="atari", **ARTICLE_SCHEDULE))
    upd.attach(net, torch.optim.Adam(net.parameters()), torch.zeros(8, 4, 84, 84, dtype=torch.uint8))
    s = upd.stats
    assert s["flops_backward_dense"] < s["flops_backward_full"]
    # conv1 and conv2 are frozen: conv2's input and weight grads and conv1's weight grad are skipped
    assert 0.5 < s["backward_saved_fraction"] < 0.8
    assert s["step_flops_ratio"] == pytest.approx((s["flops_forward"] + s["flops_backward_dense"])
                                                 / (s["flops_forward"] + s["flops_backward_full"]))


def test_a_plain_warning_when_the_dense_set_is_the_whole_network():
    net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    with pytest.warns(RlaccelWarning, match="cover every trained layer of QNet.*save nothing") as record:
        rla.SparseDenseUpdater().attach(net, torch.optim.Adam(net.parameters()), torch.zeros(1, 4), name="QNet")
    assert len(record) == 1


def test_globs_select_parameters_by_name():
    net = ActorCritic()
    upd = rla.SparseDenseUpdater(dense_layers=["action_net.*", "value_net.*", "log_std"])
    att = upd.attach(net, torch.optim.Adam(net.parameters()), torch.zeros(1, 3))
    assert len(att.dense) == 5 and len(att.frozen) == 8


# ------------------------------------------------------------------ bad input
def test_bad_input_gets_clear_errors():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"dense_layers entry -3 but Sequential has 2 layer depths .*-1: 1, -2: 0"):
        rla.SparseDenseUpdater(dense_layers=[-3]).attach(net, opt, torch.zeros(1, 4))
    with pytest.raises(ConfigError, match=r"dense_layers entry 'head\.\*' matching none. Parameters: \['0.bias'"):
        rla.SparseDenseUpdater(dense_layers=["head.*"]).attach(net, opt, torch.zeros(1, 4))
    with pytest.raises(ConfigError, match="sparse_update_interval must be >= 1, got sparse_update_interval=0"):
        rla.SparseDenseUpdater(sparse_update_interval=0)
    with pytest.raises(ConfigError, match="module must have parameters"):
        rla.SparseDenseUpdater().attach(nn.ReLU(), opt, torch.zeros(1, 4))
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="optimizer must own trainable parameters of Sequential"):
        rla.SparseDenseUpdater(dense_layers=[-1]).attach(net, other, torch.zeros(1, 4))
    with pytest.raises(ConfigError, match="example_input must be given"):
        rla.SparseDenseUpdater(dense_layers=[-1]).attach(net, opt)


# ------------------------------------------------------------------ it still learns
@pytest.mark.slow
def test_a_q_network_under_the_updater_still_learns_cartpole():
    """A compact DQN (TieredReplay + SparseDenseUpdater) on gymnasium's CartPole-v1, tested greedily every
    1,000 steps from 4,000 on (where exploration reaches its floor), up to 12,000: it must reach a 10-episode
    mean of 100 (a random policy scores ~20; this run scored 168 at 4,000 here)."""
    import gymnasium as gym

    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128),
                      nn.ReLU(), nn.Linear(128, 2))
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=5e-4)
    upd = rla.SparseDenseUpdater(sparse_update_interval=4, dense_layers=[-2, -1])
    upd.attach(q, opt, torch.zeros(1, 4))
    buf = rla.TieredReplay(level_capacity=[2000, 18000], sampling_ratio=[0.3, 0.7], seed=0)
    rng = np.random.default_rng(0)

    def greedy_mean_return() -> float:
        test_env, returns = gym.make("CartPole-v1"), []
        for episode in range(10):
            obs, _ = test_env.reset(seed=100 + episode)
            done, total = False, 0.0
            while not done:
                with torch.no_grad():
                    obs, reward, terminated, truncated, _ = test_env.step(int(q(torch.as_tensor(obs)).argmax()))
                total += reward
                done = terminated or truncated
            returns.append(total)
        return float(np.mean(returns))

    obs, _ = env.reset(seed=0)
    tested = []
    for step in range(1, 12_001):
        eps = max(0.05, 1.0 - step / 4000)
        with torch.no_grad():
            action = int(rng.integers(2)) if rng.random() < eps else int(q(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buf.add(obs=obs[None], action=np.array([action]), reward=np.array([reward], np.float32),
                next_obs=next_obs[None], terminated=np.array([terminated]))
        obs = next_obs if not (terminated or truncated) else env.reset()[0]
        if step >= 500:
            d = buf.sample(64).data
            with torch.no_grad():
                best = target(torch.as_tensor(d["next_obs"])).max(1).values
                y = torch.as_tensor(d["reward"]) + 0.99 * best * (1 - torch.as_tensor(d["terminated"]).float())
            qa = q(torch.as_tensor(d["obs"])).gather(1, torch.as_tensor(d["action"])[:, None]).squeeze(1)
            opt.zero_grad()
            nn.functional.smooth_l1_loss(qa, y).backward()
            opt.step()
            if step % 500 == 0:
                target.load_state_dict(q.state_dict())
        if step >= 4_000 and step % 1_000 == 0:
            tested.append(greedy_mean_return())
            if tested[-1] >= 100:
                break
    assert upd.stats["dense_updates"] > 2 * upd.stats["full_updates"] > 0
    assert max(tested) >= 100, tested


def test_with_every_update_full_dense_layers_do_not_apply():
    # sparse/dense off (interval 1, classic_control's setting): a 2-layer net with dense_layers=[-3, -2, -1]
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    upd = rla.SparseDenseUpdater(sparse_update_interval=1, dense_layers=[-3, -2, -1])
    att = upd.attach(net, opt, example_input=torch.zeros(2, 4))
    assert att.frozen == [] and all(p.requires_grad for p in net.parameters())
    upd.detach()
