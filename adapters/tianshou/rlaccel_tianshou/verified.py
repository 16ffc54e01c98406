"""The Tianshou code rlaccel's fused updates and ``LeanCollector`` replace or mirror, and the record of the
code they were verified against (``verified.json``, written by ``python -m rlaccel_plugins.fused.fingerprints
--update`` after the equivalence tests pass)."""

from __future__ import annotations

from pathlib import Path

from rlaccel_plugins.fused.fingerprints import Replacement, VerifiedCode

ALGO, NET = "tianshou.algorithm", "tianshou.utils.net"
_BASE = (f"{ALGO}.algorithm_base:Algorithm._update", f"{ALGO}.algorithm_base:OffPolicyAlgorithm.update",
         f"{ALGO}.algorithm_base:Algorithm.compute_nstep_return", f"{ALGO}.algorithm_base:_nstep_return",
         "tianshou.data.buffer.buffer_base:ReplayBuffer.sample_indices", f"{NET}.common:Net.forward")
_Q = (f"{ALGO}.modelfree.dqn:QLearningOffPolicyAlgorithm._preprocess_batch",
      f"{ALGO}.modelfree.dqn:QLearningOffPolicyAlgorithm._periodically_update_lagged_network_weights",
      f"{ALGO}.modelfree.dqn:DiscreteQLearningPolicy.forward")
_AC = (f"{ALGO}.modelfree.ddpg:ActorCriticOffPolicyAlgorithm._minimize_critic_squared_loss",
       f"{ALGO}.modelfree.ddpg:ActorCriticOffPolicyAlgorithm._target_q",
       f"{ALGO}.modelfree.ddpg:ActorCriticOffPolicyAlgorithm._preprocess_batch",
       f"{NET}.continuous:ContinuousCritic.forward")

REPLACEMENTS = {r.key: r for r in (
    Replacement("update:DQN", (f"{ALGO}.modelfree.dqn:DQN._update_with_batch", f"{ALGO}.modelfree.dqn:DQN._target_q",
                               *_Q, *_BASE)),
    Replacement("update:QRDQN", (f"{ALGO}.modelfree.qrdqn:QRDQN._update_with_batch",
                                 f"{ALGO}.modelfree.qrdqn:QRDQN._target_q", *_Q, *_BASE)),
    Replacement("update:DDPG", (f"{ALGO}.modelfree.ddpg:DDPG._update_with_batch",
                                f"{ALGO}.modelfree.ddpg:DDPG._target_q_compute_action", *_AC, *_BASE)),
    Replacement("update:TD3", (f"{ALGO}.modelfree.td3:TD3._update_with_batch",
                               f"{ALGO}.modelfree.td3:TD3._target_q_compute_action", *_AC, *_BASE)),
    Replacement("update:SAC", (f"{ALGO}.modelfree.sac:SAC._update_with_batch",
                               f"{ALGO}.modelfree.sac:SAC._target_q_compute_value", f"{ALGO}.modelfree.sac:SACPolicy.forward",
                               f"{ALGO}.modelfree.sac:correct_log_prob_gaussian_tanh", *_AC, *_BASE)),
    Replacement("update:PPO", (f"{ALGO}.modelfree.ppo:PPO._update_with_batch", f"{ALGO}.modelfree.ppo:PPO._preprocess_batch",
                               f"{ALGO}.modelfree.a2c:ActorCriticOnPolicyAlgorithm._add_returns_and_advantages",
                               f"{ALGO}.modelfree.reinforce:ProbabilisticActorPolicy.forward",
                               f"{ALGO}.algorithm_base:OnPolicyAlgorithm.update", f"{ALGO}.algorithm_base:Algorithm._update",
                               f"{ALGO}.algorithm_base:Algorithm.compute_episodic_return", f"{NET}.common:Net.forward")),
    Replacement("collector", ("tianshou.data.collector:BaseCollector.collect", "tianshou.data.collector:Collector._collect",
                              "tianshou.data.collector:Collector._compute_action_policy_hidden",
                              "tianshou.data.collector:Collector.reset_env")),
)}

CODE = VerifiedCode(REPLACEMENTS, Path(__file__).with_name("verified.json"), ("tianshou",))


def update_key(algorithm) -> str:
    """The replacement key of ``algorithm``'s fused update."""
    return f"update:{type(algorithm).__name__}"
