"""Milliseconds per gradient step: the framework's own update, rlaccel's fused one, and a floor.

For each algorithm and size, in one run and interleaved (rounds alternate which goes first), on the same
model and buffer contents (CartPole transitions; the net sizes are what the step costs):

- **stock**: the algorithm's own ``model.train(gradient_steps, batch_size)``;
- **fused**: ``rlaccel_sb3.fused.fused_train_for(model)`` — what ``AccelerateCallback`` installs; with
  ``--fused-optimizer``, what it installs under ``training.fused_optimizer: true`` (the single-kernel
  ``fused=True`` optimizer step, as the floor's; equal to the framework's within a tolerance, not bit for bit);
- **floor**: a minimal hand-written step of the same math, no framework and no buffer: indices from
  ``torch.randint`` into preloaded tensors, target forward under ``no_grad``, online forward, the loss,
  backward, (DQN: ``clip_grad_norm_(foreach=True)``), ``Adam(fused=True)``, Polyak updates with
  ``torch._foreach_lerp_`` (SAC: entropy tuning, twin critics; TD3: target noise, the delayed actor
  step); PPO: one minibatch of the rollout (a permutation per epoch), the actor's and critic's MLPs,
  log-softmax log-probabilities and entropy, normalised advantages, the clipped surrogate, value and
  entropy losses, backward, ``clip_grad_norm_`` and ``Adam(fused=True)``; A2C: one step on the whole
  rollout (the same MLPs, log-probabilities and entropy, the advantage-weighted and value losses,
  ``clip_grad_norm_`` and PyTorch's multi-tensor ``RMSprop``, which has no single-kernel version). It
  says what this machine allows; stock/floor says what there was to win.

Tianshou: DQN as its CartPole example builds it (``ts-dqn`` rows): ``algorithm.update(buffer, batch)``
of Tianshou's own DQN against the ``SparseDenseWrapper``'s fused update, a hand-written double
DQN 3-step floor, and the wrapper with ``compiled_updates: true`` (its step compiled or loaded in the warm-up;
SAC's too); QR-DQN (``ts-qrdqn``, 200 quantiles, 3-step) against a hand-written one with
Tianshou's quantile Huber loss; SAC (auto alpha), TD3 and DDPG on Pendulum (``ts-sac``, ``ts-td3``, ``ts-ddpg``) with
Tianshou's ``Net``-based actor and critics, against the same floors as SB3's; PPO (``ts-ppo``) as
``examples/tianshou_ppo_cartpole.py`` builds it, one epoch over 2,048 transitions per call (ms per
minibatch step, the whole update included; floor: SB3's PPO floor with ReLU MLPs, minibatch steps only).

Usage:
    python -m benchmarks.fused_bench [--steps 64] [--rounds 5] [--per-call K] [--algos dqn,qrdqn,sac,td3,ddpg]
        [--frameworks sb3,tianshou] [--tianshou-algos dqn,qrdqn,sac,td3,ddpg,ppo] [--fused-optimizer]
        [--out benchmarks/results/fused-sb3-lean]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import platform
import time

import torch
import torch.nn.functional as F

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved, medians, seconds

SIZES = [((64, 64), 64), ((256, 256), 256)]  # (hidden layers, batch size)
FUSED_OPTIMIZER = {"fused_optimizer": False}  # --fused-optimizer: the fused column with training.fused_optimizer


def build(algo: str, hidden: tuple[int, ...], device: str = "cpu"):
    from sb3_contrib import QRDQN
    from stable_baselines3 import DDPG, DQN, SAC, TD3

    cls = {"dqn": DQN, "qrdqn": QRDQN, "sac": SAC, "td3": TD3, "ddpg": DDPG}[algo]
    env = "CartPole-v1" if algo in ("dqn", "qrdqn") else "Pendulum-v1"
    model = cls("MlpPolicy", env, learning_starts=100_000, seed=0, device=device,
                policy_kwargs=dict(net_arch=list(hidden)))
    model.learn(5_000)  # fills the buffer; no update yet
    return model


def _mlp(inputs: int, hidden: tuple[int, ...], outputs: int, activation=torch.nn.ReLU) -> torch.nn.Sequential:
    layers, width = [], inputs
    for h in hidden:
        layers += [torch.nn.Linear(width, h), activation()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, outputs))


def actor_critic_floor(algo: str, hidden: tuple[int, ...], batch: int, steps: int, data: dict) -> float:
    """SAC (auto entropy, twin critics, tau 0.005), TD3 (target noise 0.2/0.5, policy delay 2) or DDPG
    (one critic) on Pendulum-shaped data (3-d observations, 1-d actions), by hand; seconds for ``steps`` steps."""
    obs, next_obs, actions, rewards, dones = (data[k] for k in ("obs", "next_obs", "actions", "rewards", "dones"))
    actor = _mlp(3, hidden, 2 if algo == "sac" else 1)
    critics = torch.nn.ModuleList([_mlp(4, hidden, 1) for _ in range(1 if algo == "ddpg" else 2)])
    actor_target, critic_target = copy.deepcopy(actor), copy.deepcopy(critics)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, fused=True)
    critic_opt = torch.optim.Adam(critics.parameters(), lr=3e-4, fused=True)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_opt = torch.optim.Adam([log_alpha], lr=3e-4, fused=True)
    pairs = [(list(critics.parameters()), list(critic_target.parameters())),
             (list(actor.parameters()), list(actor_target.parameters()))]

    def pi(net, o):  # tanh-squashed Gaussian: action, log-prob
        mean, log_std = net(o).chunk(2, dim=1)
        std = log_std.clamp(-20, 2).exp()
        u = mean + std * torch.randn_like(mean)
        a = torch.tanh(u)
        logp = (-0.5 * ((u - mean) / std) ** 2 - std.log() - 0.9189385).sum(1, keepdim=True)
        return a, logp - torch.log(1 - a**2 + 1e-6).sum(1, keepdim=True)

    start = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, len(obs), (batch,))
        o, a, o2, r, d = obs[idx], actions[idx], next_obs[idx], rewards[idx], dones[idx]
        if algo == "sac":
            a_pi, logp = pi(actor, o)
            alpha = log_alpha.detach().exp()
            alpha_loss = -(log_alpha * (logp + -1.0).detach()).mean()
            alpha_opt.zero_grad()
            alpha_loss.backward()
            alpha_opt.step()
        with torch.no_grad():
            if algo == "sac":
                a2, logp2 = pi(actor, o2)
            elif algo == "td3":
                a2 = (torch.tanh(actor_target(o2)) + (0.2 * torch.randn_like(a)).clamp(-0.5, 0.5)).clamp(-1, 1)
            else:
                a2 = torch.tanh(actor_target(o2))
            x2 = torch.cat([o2, a2], dim=1)
            q2 = critic_target[0](x2) if algo == "ddpg" else torch.min(critic_target[0](x2), critic_target[1](x2))
            if algo == "sac":
                q2 = q2 - alpha * logp2
            y = r + (1 - d) * 0.99 * q2
        x = torch.cat([o, a], dim=1)
        critic_loss = sum(torch.nn.functional.mse_loss(c(x), y) for c in critics) * (0.5 if algo == "sac" else 1)
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        if algo != "td3" or step % 2 == 1:
            a_new = a_pi if algo == "sac" else torch.tanh(actor(o))
            q = critics[0](torch.cat([o, a_new], dim=1))
            if algo == "sac":
                q = torch.min(q, critics[1](torch.cat([o, a_new], dim=1)))
            actor_loss = ((alpha * logp - q) if algo == "sac" else -q).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
            with torch.no_grad():
                for params, targets in pairs if algo != "sac" else pairs[:1]:
                    torch._foreach_lerp_(targets, params, 0.005)
    return time.perf_counter() - start


def floor_step(algo: str, hidden: tuple[int, ...], batch: int, steps: int, rounds_data: dict) -> float:
    """The same math by hand; returns seconds for ``steps`` gradient steps."""
    if algo in ("sac", "td3", "ddpg"):
        return actor_critic_floor(algo, hidden, batch, steps, rounds_data)
    obs, next_obs, actions, rewards, dones = (rounds_data[k] for k in ("obs", "next_obs", "actions", "rewards", "dones"))
    n_out = 2 if algo == "dqn" else 2 * 200
    layers, width = [], 4
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, n_out))
    target = copy.deepcopy(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, fused=True)
    params = list(net.parameters())
    start = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, len(obs), (batch,))
        with torch.no_grad():
            if algo == "dqn":
                y = rewards[idx] + (1 - dones[idx]) * 0.99 * target(next_obs[idx]).max(dim=1).values.unsqueeze(1)
            else:
                nq = target(next_obs[idx]).view(batch, 200, 2)
                greedy = nq.mean(dim=1, keepdim=True).argmax(dim=2, keepdim=True).expand(batch, 200, 1)
                y = rewards[idx] + (1 - dones[idx]) * 0.99 * nq.gather(2, greedy).squeeze(2)
        if algo == "dqn":
            q = net(obs[idx]).gather(1, actions[idx])
            loss = F.smooth_l1_loss(q, y)
        else:
            q = net(obs[idx]).view(batch, 200, 2).gather(2, actions[idx][..., None].expand(batch, 200, 1)).squeeze(2)
            delta = y.unsqueeze(-2) - q.unsqueeze(-1)
            huber = torch.where(delta.abs() > 1, delta.abs() - 0.5, delta**2 * 0.5)
            tau = ((torch.arange(200, dtype=torch.float) + 0.5) / 200).view(1, -1, 1)
            loss = ((tau - (delta.detach() < 0).float()).abs() * huber).sum(dim=-2).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0, foreach=True)
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=64, help="gradient steps per timed call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-call", type=int, default=None,
                        help="SB3: gradient steps per train() call (default: all --steps in one call; "
                             "1 is SAC's train_freq=1 / gradient_steps=1)")
    parser.add_argument("--algos", default="dqn,qrdqn,sac,td3,ddpg", help="SB3 algorithms (empty: none)")
    parser.add_argument("--frameworks", default="sb3,tianshou")
    parser.add_argument("--tianshou-algos", default="dqn,qrdqn,sac,td3,ddpg,ppo", help="Tianshou algorithms")
    parser.add_argument("--no-ppo", dest="ppo", action="store_false", help="skip the SB3 PPO rows")
    parser.add_argument("--no-a2c", dest="a2c", action="store_false", help="skip the SB3 A2C rows")
    parser.add_argument("--fused-optimizer", action="store_true",
                        help="the fused column with training.fused_optimizer: true (single-kernel optimizer step)")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    ROWS.clear()
    FUSED_OPTIMIZER["fused_optimizer"] = args.fused_optimizer
    from rlaccel_sb3.fused import fused_train_for

    torch.set_num_threads(torch.get_num_threads())
    print(f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
          f"ms per gradient step, median of {args.rounds} interleaved rounds of {args.steps} steps"
          + ("; fused = with training.fused_optimizer" if args.fused_optimizer else ""))
    print(f"{'algorithm':<8} {'net':<9} {'batch':>5} {'stock':>7} {'fused':>7} {'floor':>7} "
          f"{'fused/stock':>11} {'fused/floor':>11} {'stock/floor':>11}")
    for algo in [a for a in args.algos.split(",") if a] if "sb3" in args.frameworks.split(",") else []:
        for hidden, batch in SIZES:
            stock_model = build(algo, hidden)
            fused_model = build(algo, hidden)
            fused = fused_train_for(fused_model, **FUSED_OPTIMIZER)
            buf = stock_model.replay_buffer
            n = buf.pos
            data = {"obs": torch.as_tensor(buf.observations[:n, 0]),
                    "next_obs": torch.as_tensor(buf.next_observations[:n, 0]),
                    "actions": torch.as_tensor(buf.actions[:n, 0]), "rewards": torch.as_tensor(buf.rewards[:n]),
                    "dones": torch.as_tensor(buf.dones[:n])}
            if algo in ("dqn", "qrdqn"):
                data["actions"] = data["actions"].long()
            steps = args.steps if (algo, hidden) != ("qrdqn", (256, 256)) else max(4, args.steps // 8)  # ~150 ms each
            per_call = args.per_call or steps
            stock_model.train(2, batch)  # warm-up
            fused(2, batch)
            times = interleaved(
                {name: functools.partial(seconds, functools.partial(train, per_call, batch), steps // per_call)
                 for name, train in (("stock", stock_model.train), ("fused", fused))}
                | {"floor": functools.partial(floor_step, algo, hidden, batch, steps, data)},
                args.rounds, alternate=True)
            ms = {k: 1e3 * v / steps for k, v in medians(times).items()}
            print_row(algo, hidden, batch, ms)
    if "sb3" in args.frameworks.split(",") and args.ppo:
        ppo_rows(args.rounds)
    if "sb3" in args.frameworks.split(",") and args.a2c:
        a2c_rows(args.rounds)
    if "tianshou" in args.frameworks.split(","):
        tianshou_algos = args.tianshou_algos.split(",")
        if "dqn" in tianshou_algos:
            tianshou_rows(args.steps, args.rounds)
        if "qrdqn" in tianshou_algos:
            tianshou_qrdqn_rows(args.steps, args.rounds)
        for algo in [a for a in tianshou_algos if a in ("sac", "td3", "ddpg")]:
            tianshou_actor_critic_rows(algo, args.steps, args.rounds)
        if "ppo" in tianshou_algos:
            tianshou_ppo_rows(args.rounds)
    first = ROWS[0]
    _results.write(args.out, "fused_bench", rows=ROWS, steps=args.steps, fused_optimizer=args.fused_optimizer,
                   headline=(f"{first['algorithm']} {first['net']} batch {first['batch']}, a gradient step: fused "
                             f"{first['fused_vs_stock']:.2f}x the framework's time"))


def ppo_rows(rounds: int) -> None:
    """SB3 PPO with RL Zoo's CartPole settings (8 envs x 32 steps, batch 256, 20 epochs: 20 minibatch
    steps per ``train()``), and the same with a 256-256 net at batch 64 (80 steps): ``train()`` on one
    collected rollout, SB3's own against the fused one and :func:`ppo_floor`; ms per minibatch step."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    for hidden, batch in [((64, 64), 256), ((256, 256), 64)]:
        models = _collected_twins(lambda hidden=hidden, batch=batch: PPO(
            "MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=0), n_steps=32, batch_size=batch, gae_lambda=0.8,
            gamma=0.98, n_epochs=20, learning_rate=1e-3, seed=0, device="cpu", policy_kwargs=dict(net_arch=list(hidden))))
        floor = functools.partial(ppo_floor, hidden, batch, epochs=20, transitions=256)
        print_row("ppo", hidden, batch, _on_policy_ms(models, rounds, 1, 20 * (256 // batch), floor, warm_up=False))


def a2c_rows(rounds: int, calls: int = 200) -> None:
    """SB3 A2C with RL Zoo's CartPole settings (8 envs x 5 steps: one gradient step on 40 transitions per
    ``train()``), and the same with a 256-256 net: ``train()`` on one collected rollout, SB3's own against
    the fused one and :func:`a2c_floor`; ms per gradient step (= per call)."""
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    for hidden in [(64, 64), (256, 256)]:
        models = _collected_twins(lambda hidden=hidden: A2C(
            "MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=0), ent_coef=0.0, seed=0, device="cpu",
            policy_kwargs=dict(net_arch=list(hidden))))
        floor = functools.partial(a2c_floor, hidden, calls, transitions=40)
        print_row("a2c", hidden, 40, _on_policy_ms(models, rounds, calls, 1, floor, warm_up=True))


def _collected_twins(make) -> list:
    """Two on-policy models from ``make()``, each with one rollout collected for ``train()`` to run on."""
    models = []
    for _ in range(2):
        model = make()
        _, callback = model._setup_learn(total_timesteps=10**7, callback=None)
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
        models.append(model)
    return models


def _on_policy_ms(models: list, rounds: int, calls: int, steps_per_call: int, floor, warm_up: bool) -> dict[str, float]:
    """ms per gradient step of SB3's ``train()`` (``models[0]``) and the fused one (``models[1]``), ``calls``
    calls a round, rounds alternating who goes first, and of ``floor()`` (seconds for the same steps) after
    each round; medians."""
    from rlaccel_sb3.fused import fused_train_for

    trains = {"stock": models[0].train, "fused": fused_train_for(models[1], **FUSED_OPTIMIZER)}
    if warm_up:
        for train in trains.values():
            train()
    times = interleaved({name: functools.partial(seconds, train, calls) for name, train in trains.items()}
                        | {"floor": floor}, rounds, alternate=True)
    return {k: 1e3 * v / (calls * steps_per_call) for k, v in medians(times).items()}


def a2c_floor(hidden: tuple[int, ...], steps: int, transitions: int) -> float:
    """SB3 A2C's step by hand (CartPole; SB3's default Tanh MLPs for the actor and the critic; the
    log-softmax log-probability and entropy, value coefficient 0.5, entropy coefficient 0, gradient norm
    0.5, ``RMSprop(alpha=0.99, eps=1e-5)`` — PyTorch has no single-kernel RMSprop, so its multi-tensor
    one): seconds for ``steps`` steps on ``transitions``."""
    torch.manual_seed(0)
    actor, critic = _mlp(4, hidden, 2, torch.nn.Tanh), _mlp(4, hidden, 1, torch.nn.Tanh)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.RMSprop(params, lr=7e-4, alpha=0.99, eps=1e-5, foreach=True)
    obs, act = torch.randn(transitions, 4), torch.randint(0, 2, (transitions,))
    advantages, returns = torch.randn(transitions), torch.randn(transitions)
    start = time.perf_counter()
    for _ in range(steps):
        log_prob, entropy = _log_prob_and_entropy(actor(obs), act)
        policy_loss = -(advantages * log_prob).mean()
        _on_policy_step(optimizer, params, policy_loss, F.mse_loss(returns, critic(obs).squeeze(1)), entropy)
    return time.perf_counter() - start


def _log_prob_and_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A categorical policy's log-probabilities of ``actions`` and its entropies, from log-softmax."""
    log_probs = torch.log_softmax(logits, dim=1)
    return log_probs.gather(1, actions.unsqueeze(1)).squeeze(1), -(log_probs.exp() * log_probs).sum(dim=1)


def _on_policy_step(optimizer, params: list, policy_loss: torch.Tensor, value_loss: torch.Tensor,
                    entropy: torch.Tensor) -> None:
    """The on-policy loss (entropy coefficient 0, value coefficient 0.5), backward, the gradient clipped to
    norm 0.5, the optimizer's step."""
    loss = policy_loss + 0.0 * -entropy.mean() + 0.5 * value_loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 0.5, foreach=True)
    optimizer.step()


def ppo_floor(hidden: tuple[int, ...], batch: int, epochs: int, transitions: int, activation=torch.nn.Tanh) -> float:
    """SB3 PPO's minibatch step by hand (CartPole: 4 observations, 2 actions; SB3's default Tanh MLPs for
    the actor and the critic — ReLU for Tianshou's ``Net`` —, clip 0.2, value coefficient 0.5, entropy
    coefficient 0, gradient norm 0.5): seconds for ``epochs`` passes over ``transitions`` in minibatches
    of ``batch``."""
    torch.manual_seed(0)
    actor, critic = _mlp(4, hidden, 2, activation), _mlp(4, hidden, 1, activation)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-3, eps=1e-5, fused=True)
    obs, act = torch.randn(transitions, 4), torch.randint(0, 2, (transitions,))
    old_log_prob, advantages, returns = -torch.rand(transitions), torch.randn(transitions), torch.randn(transitions)
    start = time.perf_counter()
    for _ in range(epochs):
        for idx in torch.randperm(transitions).split(batch):
            log_prob, entropy = _log_prob_and_entropy(actor(obs[idx]), act[idx])
            adv = advantages[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = torch.exp(log_prob - old_log_prob[idx])
            policy_loss = -torch.min(adv * ratio, adv * torch.clamp(ratio, 0.8, 1.2)).mean()
            _on_policy_step(optimizer, params, policy_loss, F.mse_loss(returns[idx], critic(obs[idx]).squeeze(1)),
                            entropy)
    return time.perf_counter() - start


ROWS: list[dict] = []  # every row printed, for the results file


def print_row(label: str, hidden: tuple[int, ...], batch: int, ms: dict[str, float]) -> None:
    """One table row from the ms per gradient step of stock, fused and the floor."""
    ROWS.append({"algorithm": label, "net": "-".join(map(str, hidden)), "batch": batch,
                 **{f"{name}_ms": value for name, value in ms.items()}, "fused_vs_stock": ms["fused"] / ms["stock"],
                 "fused_vs_floor": ms["fused"] / ms["floor"]})
    compiled = f"  compiled {ms['compiled']:.2f} ({ms['compiled'] / ms['stock']:.2f}x stock)" if "compiled" in ms else ""
    print(f"{label:<8} {'-'.join(map(str, hidden)):<9} {batch:>5} {ms['stock']:>7.2f} {ms['fused']:>7.2f} "
          f"{ms['floor']:>7.2f} {ms['fused'] / ms['stock']:>10.2f}x {ms['fused'] / ms['floor']:>10.2f}x "
          f"{ms['stock'] / ms['floor']:>10.2f}x{compiled}")


def tianshou_update_ms(stock, fused, buffer, batch: int, steps: int, rounds: int, floor,
                       compiled=None) -> dict[str, float]:
    """ms per update of Tianshou's own ``update`` and the wrapper's fused one (after one warm-up each;
    rounds alternate who goes first), of ``floor()`` (seconds for ``steps`` steps), and of a wrapper with
    ``training.compiled_updates: true`` where given; medians."""
    from tianshou.utils.torch_utils import policy_within_training_step

    def updates_of(algorithm):
        return functools.partial(seconds, functools.partial(algorithm.update, buffer, batch), steps)

    algorithms = {"stock": stock, "fused": fused, **({"compiled": compiled} if compiled is not None else {})}
    with contextlib.ExitStack() as stack:
        for algorithm in algorithms.values():
            stack.enter_context(policy_within_training_step(algorithm.policy))
            algorithm.update(buffer, batch)  # the warm-up (the compiled step compiles or loads here)
        times = interleaved({**{name: updates_of(a) for name, a in algorithms.items()}, "floor": floor},
                            rounds, alternate=True)
    return {k: 1e3 * v / steps for k, v in medians(times).items()}


def tianshou_rows(steps: int, rounds: int) -> None:
    """Tianshou DQN (the example's settings: double DQN, 3-step, MSE, 128-128-128, batch 64) on CartPole:
    Tianshou's own ``update``, the wrapper's fused one, a floor of the same math, and the wrapper with
    ``compiled_updates: true``."""
    import gymnasium as gym
    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    from rlaccel_plugins.loader import load_config

    for hidden, batch in [((128, 128, 128), 64), ((256, 256), 256)]:
        def algorithm(hidden=hidden):
            torch.manual_seed(0)
            policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=list(hidden)),
                                             action_space=gym.spaces.Discrete(2), eps_training=0.1)
            return DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3,
                       target_update_freq=320)

        stock, fused, buffer, data = _tianshou_cartpole(algorithm)
        compiled = SparseDenseWrapper(algorithm(), config=load_config(preset="classic_control", compiled_updates=True))
        print_row("ts-dqn", hidden, batch, tianshou_update_ms(
            stock, fused, buffer, batch, steps, rounds, functools.partial(tianshou_floor, hidden, batch, steps, data),
            compiled))


def _tianshou_cartpole(make_algorithm):
    """Tianshou's own algorithm, the fused wrapper around a twin, the example's 10-env vector buffer filled
    with 10k random CartPole steps, and the same transitions as tensors for the floor."""
    import gymnasium as gym
    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    from rlaccel_plugins.loader import load_config

    stock = make_algorithm()
    fused = SparseDenseWrapper(make_algorithm(), config=load_config(preset="classic_control", fused_updates=True,
                                                                    **FUSED_OPTIMIZER))
    buffer = VectorReplayBuffer(20_000, 10)
    collector = Collector(stock, DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(10)]), buffer)
    collector.reset()
    collector.collect(n_step=10_000, random=True)
    data = {"obs": torch.as_tensor(buffer.obs[:10_000]), "rew": torch.as_tensor(buffer.rew[:10_000]).float(),
            "done": torch.as_tensor(buffer.done[:10_000]).float(), "act": torch.as_tensor(buffer.act[:10_000]).long()}
    return stock, fused, buffer, data


def tianshou_qrdqn_rows(steps: int, rounds: int) -> None:
    """Tianshou QR-DQN as its CartPole example builds it (200 quantiles, 3-step, 128-128-128, batch 64;
    and 256-256 at batch 256 with fewer steps per round): its own ``update`` against the fused one and
    :func:`tianshou_qrdqn_floor`."""
    import gymnasium as gym
    from tianshou.algorithm import QRDQN
    from tianshou.algorithm.modelfree.qrdqn import QRDQNPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net


    for hidden, batch in [((128, 128, 128), 64), ((256, 256), 256)]:
        def algorithm(hidden=hidden):
            torch.manual_seed(0)
            net = Net(state_shape=4, action_shape=2, hidden_sizes=list(hidden), num_atoms=200)
            policy = QRDQNPolicy(model=net, action_space=gym.spaces.Discrete(2), eps_training=0.1)
            return QRDQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, num_quantiles=200,
                         n_step_return_horizon=3, target_update_freq=320)

        stock, fused, buffer, data = _tianshou_cartpole(algorithm)
        n = steps if batch == 64 else max(4, steps // 8)
        print_row("ts-qrdqn", hidden, batch, tianshou_update_ms(
            stock, fused, buffer, batch, n, rounds, functools.partial(tianshou_qrdqn_floor, hidden, batch, n, data)))


def tianshou_qrdqn_floor(hidden: tuple[int, ...], batch: int, steps: int, data: dict, quantiles: int = 200) -> float:
    """QR-DQN with 3-step returns by hand: Tianshou's quantile Huber loss (``smooth_l1_loss`` between every
    target and current quantile, weighted by ``|tau_hat - 1[delta < 0]|``), episode ends ignored."""
    layers, width = [], 4
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 2 * quantiles))
    target = copy.deepcopy(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    tau_hat = ((torch.arange(quantiles, dtype=torch.float) + 0.5) / quantiles).view(1, -1, 1)
    obs, rew, done, act = data["obs"], data["rew"], data["done"], data["act"]
    rows = torch.arange(batch)
    start = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, len(obs) - 3, (batch,))
        with torch.no_grad():
            after = obs[idx + 3]
            greedy = net(after).view(batch, 2, quantiles).mean(2).argmax(dim=1)
            next_dist = target(after).view(batch, 2, quantiles)[rows, greedy, :]
            returns = (rew[idx] + 0.9 * rew[idx + 1] + 0.81 * rew[idx + 2]).unsqueeze(1) \
                + 0.729 * (1 - done[idx + 2]).unsqueeze(1) * next_dist
        current = net(obs[idx]).view(batch, 2, quantiles)[rows, act[idx], :].unsqueeze(2)
        target_dist = returns.unsqueeze(1)
        dist_diff = F.smooth_l1_loss(target_dist, current, reduction="none")
        loss = (dist_diff * (tau_hat - (target_dist - current).detach().le(0.0).float()).abs()).sum(-1).mean(1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def tianshou_actor_critic(algo: str, hidden: tuple[int, ...]):
    """Tianshou's SAC (auto alpha), TD3 or DDPG for Pendulum with ``hidden`` actor and critic layers."""
    import gymnasium as gym
    from tianshou.algorithm import DDPG, SAC, TD3
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.modelfree.sac import AutoAlpha, SACPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )

    torch.manual_seed(0)
    space, optim = gym.spaces.Box(-2.0, 2.0, (1,)), AdamOptimizerFactory(lr=3e-4)
    trunk = dict(state_shape=3, hidden_sizes=list(hidden))

    def critic():
        return ContinuousCritic(preprocess_net=Net(**trunk, action_shape=1, concat=True))

    if algo == "sac":
        actor = ContinuousActorProbabilistic(preprocess_net=Net(**trunk), action_shape=1, unbounded=True,
                                             conditioned_sigma=True)
        return SAC(policy=SACPolicy(actor=actor, action_space=space), policy_optim=optim, critic=critic(),
                   critic_optim=optim, critic2=critic(), critic2_optim=optim,
                   alpha=AutoAlpha(-1.0, 0.0, AdamOptimizerFactory(lr=3e-4)))
    policy = ContinuousDeterministicPolicy(actor=ContinuousActorDeterministic(preprocess_net=Net(**trunk),
                                                                              action_shape=1), action_space=space)
    if algo == "td3":
        return TD3(policy=policy, policy_optim=optim, critic=critic(), critic_optim=optim, critic2=critic(),
                   critic2_optim=optim)
    return DDPG(policy=policy, policy_optim=optim, critic=critic(), critic_optim=optim)


def tianshou_actor_critic_rows(algo: str, steps: int, rounds: int) -> None:
    """Tianshou's own ``update`` of SAC/TD3/DDPG against the wrapper's fused one, the floor and (SAC) the
    wrapper with ``compiled_updates: true``."""
    import gymnasium as gym
    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    from rlaccel_plugins.loader import load_config

    for hidden, batch in SIZES:
        stock = tianshou_actor_critic(algo, hidden)
        fused = SparseDenseWrapper(tianshou_actor_critic(algo, hidden),
                                   config=load_config(preset="classic_control", fused_updates=True, **FUSED_OPTIMIZER))
        buffer = VectorReplayBuffer(20_000, 10)
        collector = Collector(stock, DummyVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(10)]), buffer)
        collector.reset()
        collector.collect(n_step=10_000, random=True)
        data = {"obs": torch.as_tensor(buffer.obs[:10_000]), "next_obs": torch.as_tensor(buffer.obs_next[:10_000]),
                "actions": torch.as_tensor(buffer.act[:10_000]).float().reshape(-1, 1),
                "rewards": torch.as_tensor(buffer.rew[:10_000]).float().reshape(-1, 1),
                "dones": torch.as_tensor(buffer.done[:10_000]).float().reshape(-1, 1)}
        compiled = SparseDenseWrapper(tianshou_actor_critic(algo, hidden), config=load_config(
            preset="classic_control", compiled_updates=True)) if algo == "sac" else None
        print_row("ts-" + algo, hidden, batch, tianshou_update_ms(
            stock, fused, buffer, batch, steps, rounds, functools.partial(actor_critic_floor, algo, hidden, batch, steps,
                                                                      data), compiled))


def tianshou_ppo_rows(rounds: int) -> None:
    """Tianshou's own PPO ``update`` against the on-policy wrapper's fused one (64-64 actor and critic)."""
    import gymnasium as gym
    from rlaccel_tianshou import SparseDenseOnPolicyWrapper
    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
    from tianshou.utils.torch_utils import policy_within_training_step

    from rlaccel_plugins.loader import load_config

    def ppo():
        torch.manual_seed(0)
        actor = DiscreteActor(preprocess_net=Net(state_shape=4, hidden_sizes=[64, 64]), action_shape=2)
        critic = DiscreteCritic(preprocess_net=Net(state_shape=4, hidden_sizes=[64, 64]))
        policy = DiscreteActorPolicy(actor=actor, action_space=gym.spaces.Discrete(2))
        return PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=3e-4), gamma=0.99)

    stock = ppo()
    fused = SparseDenseOnPolicyWrapper(ppo(), config=load_config(preset="classic_control", fused_updates=True, **FUSED_OPTIMIZER))
    for batch in (64, 256):
        buffer = VectorReplayBuffer(2_048, 8)
        collector = Collector(stock, DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(8)]), buffer)
        collector.reset()
        collector.collect(n_step=2_048)
        steps = -(-len(buffer) // batch)  # minibatches per epoch (the last one merged when short)
        with policy_within_training_step(stock.policy), policy_within_training_step(fused.policy):
            times = interleaved(
                {"stock": functools.partial(seconds, functools.partial(stock.update, buffer, batch, 1)),
                 "fused": functools.partial(seconds, functools.partial(fused.update, buffer, batch, 1)),
                 # the minibatch steps only (Tianshou's update also computes the rollout's GAE first)
                 "floor": functools.partial(ppo_floor, (64, 64), batch, 1, len(buffer), torch.nn.ReLU)},
                rounds, alternate=True)
        print_row("ts-ppo", (64, 64), batch, {k: 1e3 * v / steps for k, v in medians(times).items()})


def tianshou_floor(hidden: tuple[int, ...], batch: int, steps: int, data: dict) -> float:
    """Double DQN with 3-step returns by hand (episode ends inside the n steps are ignored: the same ops)."""
    layers, width = [], 4
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 2))
    target = copy.deepcopy(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    obs, rew, done, act = data["obs"], data["rew"], data["done"], data["act"]
    start = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, len(obs) - 3, (batch,))
        with torch.no_grad():
            after = obs[idx + 3]
            q_next = target(after).gather(1, net(after).argmax(dim=1, keepdim=True)).squeeze(1)
            returns = rew[idx] + 0.9 * rew[idx + 1] + 0.81 * rew[idx + 2] + 0.729 * (1 - done[idx + 2]) * q_next
        q = net(obs[idx]).gather(1, act[idx].unsqueeze(1)).squeeze(1)
        loss = (returns - q).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
