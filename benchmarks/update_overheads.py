"""Per-call cost of the bookkeeping around a fused update: the framework's own way against rlaccel's, in one process.

Interleaved rounds, the minimum per piece (the host's noise only ever adds time), µs per call:

- Tianshou ``sample_indices(64)`` on a 10-env ``VectorReplayBuffer`` (its own: eleven ``choice`` calls)
  against ``rlaccel_tianshou.buffer_reads.sample_indices`` (the same draws);
- ``unfinished_index()`` of the same buffer against ``buffer_reads.unfinished_index``;
- what a Tianshou TD3 update builds from its networks (64-64): every network's flat forward, the three
  mode checks and the six parameter lists of the Polyak update, built from scratch against kept per
  network (``rlaccel_plugins.fused.module_cache``: a snapshot check per network and update phase);
- SB3's ``policy.set_training_mode(True)`` of a SAC and a DQN policy against
  ``rlaccel_sb3.training_mode.set_training_mode`` (the same flags, written flat);
- what a fused SB3 SAC / TD3 gradient step runs through its networks — SAC: the actor's squashed-Gaussian
  sample twice (next and current observations) and the critic three times, TD3: the target actor and
  critic, the critic, the actor and ``q1_forward`` — forward and backward, through SB3's modules against
  ``rlaccel_sb3.flat_actor_critic`` (the same ops without module calls).

Usage:
    python -m benchmarks.update_overheads [--rounds 7] [--number 2000]
"""

from __future__ import annotations

import argparse
import platform
import timeit
from functools import partial

import gymnasium as gym
import numpy as np
import torch

from benchmarks import _results
from rlaccel_plugins.bench.timing import interleaved


def tianshou_pieces() -> dict[str, tuple]:
    from rlaccel_tianshou import buffer_reads
    from rlaccel_tianshou import flat_networks as ts_networks
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    from benchmarks.fused_bench import tianshou_actor_critic

    td3 = tianshou_actor_critic("td3", (64, 64))
    buffer = VectorReplayBuffer(20_000, 10)
    collector = Collector(td3, DummyVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(10)]), buffer)
    collector.reset()
    collector.collect(n_step=10_000, random=True)
    forwards = [td3.actor_old, td3.critic_old, td3.critic2_old, td3.critic, td3.critic2, td3.critic, td3.policy.actor]
    modes = [td3.policy.actor, td3.critic, td3.critic2]
    pairs = td3._lagged_networks._lagged_network_pairs
    polyak = [n for pair in pairs for n in (pair.source, pair.target)]

    def built_from_scratch():
        for network in forwards:
            ts_networks._flat_forward(network)
        ts_networks._tree_mode_free(modes[0]), ts_networks._tree_mode_free(modes[1]), ts_networks._tree_mode_free(modes[2])
        for network in polyak:
            list(network.parameters())

    def kept():  # two update phases: the target side, then the training step
        ts_networks.next_epoch()
        for network in forwards[:3]:
            ts_networks.forward_of(network)
        ts_networks.next_epoch()
        ts_networks.is_mode_free(*modes)
        for network in forwards[3:]:
            ts_networks.forward_of(network)
        for network in polyak:
            ts_networks.parameters_of(network)

    return {"Tianshou sample_indices(64), 10-env vector buffer": (lambda: buffer.sample_indices(64),
                                                                  lambda: buffer_reads.sample_indices(buffer, 64)),
            "Tianshou unfinished_index(), 10-env vector buffer": (buffer.unfinished_index,
                                                                  lambda: buffer_reads.unfinished_index(buffer)),
            "Tianshou TD3 64-64: flat forwards, mode checks, parameter lists": (built_from_scratch, kept)}


def sb3_pieces() -> dict[str, tuple]:
    from rlaccel_sb3.training_mode import set_training_mode
    from stable_baselines3 import DQN, SAC

    pieces = {}
    for name, model in (("SAC", SAC("MlpPolicy", "Pendulum-v1")), ("DQN", DQN("MlpPolicy", "CartPole-v1"))):
        policy = model.policy
        pieces[f"SB3 {name} policy.set_training_mode(True)"] = (lambda p=policy: p.set_training_mode(True),
                                                                 lambda p=policy: set_training_mode(p, True))
    for algo, hidden, batch in (("SAC", (64, 64), 64), ("SAC", (256, 256), 256), ("TD3", (64, 64), 64)):
        pieces[f"SB3 {algo} {hidden[0]}-{hidden[1]} b{batch}: a step's network calls, fwd + bwd"] = \
            _actor_critic_calls(algo, hidden, batch)
    return pieces


def _actor_critic_calls(algo: str, hidden: tuple[int, ...], batch: int) -> tuple:
    from rlaccel_sb3 import flat_actor_critic as flat
    from stable_baselines3 import SAC, TD3

    model = {"SAC": SAC, "TD3": TD3}[algo]("MlpPolicy", "Pendulum-v1", seed=0, policy_kwargs=dict(net_arch=list(hidden)))
    obs, act = torch.randn(batch, 3), torch.rand(batch, 1) * 2 - 1
    actor, critic = model.actor, model.critic
    if algo == "SAC":
        own = (actor.action_log_prob, critic, model.critic_target)
        lean = (flat.action_log_prob(actor), flat.critic_forward(critic), flat.critic_forward(model.critic_target))

        def calls(sample, critic_call, target_call):
            with torch.no_grad():
                next_actions, _ = sample(obs)
                target_call(obs, next_actions)
            actions, log_prob = sample(obs)
            q = critic_call(obs, act)
            q_pi = critic_call(obs, actions)
            (log_prob.sum() + q[0].sum() + q[1].sum() + q_pi[0].sum() + q_pi[1].sum()).backward()
    else:
        own = (actor, critic, critic.q1_forward, model.actor_target, model.critic_target)
        lean = (flat.actor_forward(actor), flat.critic_forward(critic), flat.critic_q1(critic),
                flat.actor_forward(model.actor_target), flat.critic_forward(model.critic_target))

        def calls(actor_call, critic_call, q1_call, target_actor_call, target_critic_call):
            with torch.no_grad():
                target_critic_call(obs, target_actor_call(obs))
            q = critic_call(obs, act)
            (q[0].sum() + q[1].sum() - q1_call(obs, actor_call(obs)).sum()).backward()
    return (lambda: calls(*own)), (lambda: calls(*lean))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000, help="calls per timing")
    _results.add_out_argument(parser)
    args = parser.parse_args()
    np.random.seed(0)
    torch.manual_seed(0)
    pieces = {**tianshou_pieces(), **sb3_pieces()}
    print(f"{platform.machine()}, torch {torch.__version__}; µs per call, minimum of {args.rounds} interleaved rounds "
          f"of {args.number} calls")
    print(f"{'piece':<66} {'own':>8} {'rlaccel':>8} {'ratio':>7}")
    rows = []
    for name, (own, lean) in pieces.items():
        times = interleaved({key: partial(timeit.timeit, call, number=args.number)
                             for key, call in (("own", own), ("lean", lean))}, args.rounds, alternate=True)
        best = {k: min(v) / args.number * 1e6 for k, v in times.items()}
        print(f"{name:<66} {best['own']:>8.1f} {best['lean']:>8.1f} {best['lean'] / best['own']:>6.2f}x")
        rows.append({"piece": name, "own_us": best["own"], "rlaccel_us": best["lean"],
                     "rlaccel_vs_own": best["lean"] / best["own"]})
    sac = next((row for row in rows if row["piece"].startswith("SB3 SAC 64-64")), rows[-1])
    _results.write(args.out, "update_overheads", rows=rows,
                   headline=f"{sac['piece']}: {sac['rlaccel_vs_own']:.2f}x the framework's time")


if __name__ == "__main__":
    main()
