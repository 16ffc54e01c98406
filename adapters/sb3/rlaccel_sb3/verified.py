"""The SB3 code rlaccel's fused updates and lean collection replace or mirror, and the record of the code
they were verified against (``verified.json``, written by ``python -m rlaccel_plugins.fused.fingerprints
--update`` after the equivalence tests pass)."""

from __future__ import annotations

from pathlib import Path

from rlaccel_plugins.fused.fingerprints import Replacement, VerifiedCode

SB3, CONTRIB = "stable_baselines3", "sb3_contrib"
_RATE = f"{SB3}.common.base_class:BaseAlgorithm._update_learning_rate"
_POLYAK = f"{SB3}.common.utils:polyak_update"
_REPLAY = (f"{SB3}.common.buffers:ReplayBuffer.sample", f"{SB3}.common.buffers:ReplayBuffer._get_samples")
_ROLLOUT = (f"{SB3}.common.buffers:RolloutBuffer.get", f"{SB3}.common.buffers:RolloutBuffer._get_samples")
_MODE = f"{SB3}.common.policies:BaseModel.set_training_mode"
_CRITIC = (f"{SB3}.common.policies:ContinuousCritic.forward", f"{SB3}.common.policies:ContinuousCritic.q1_forward")
_ACTOR_CRITIC = (f"{SB3}.common.policies:ActorCriticPolicy.evaluate_actions",
                 f"{SB3}.common.policies:ActorCriticPolicy._get_action_dist_from_latent",
                 f"{SB3}.common.policies:ActorCriticPolicy.extract_features",
                 f"{SB3}.common.torch_layers:MlpExtractor.forward")

REPLACEMENTS = {r.key: r for r in (
    Replacement("train:DQN", (f"{SB3}.dqn.dqn:DQN.train", f"{SB3}.dqn.policies:QNetwork.forward", _RATE, _MODE,
                              *_REPLAY)),
    Replacement("train:QRDQN", (f"{CONTRIB}.qrdqn.qrdqn:QRDQN.train", f"{CONTRIB}.qrdqn.policies:QuantileNetwork.forward",
                                f"{CONTRIB}.common.utils:quantile_huber_loss", _RATE, _MODE, *_REPLAY)),
    Replacement("train:SAC", (f"{SB3}.sac.sac:SAC.train", f"{SB3}.sac.policies:Actor.action_log_prob",
                              f"{SB3}.sac.policies:Actor.get_action_dist_params",
                              f"{SB3}.common.distributions:SquashedDiagGaussianDistribution.log_prob",
                              f"{SB3}.common.distributions:SquashedDiagGaussianDistribution.log_prob_from_params",
                              *_CRITIC, _POLYAK, _RATE, _MODE, *_REPLAY)),
    Replacement("train:TD3", (f"{SB3}.td3.td3:TD3.train", f"{SB3}.td3.policies:Actor.forward", *_CRITIC, _POLYAK,
                              _RATE, _MODE, *_REPLAY)),
    Replacement("train:PPO", (f"{SB3}.ppo.ppo:PPO.train", *_ACTOR_CRITIC, *_ROLLOUT, _RATE, _MODE)),
    Replacement("train:A2C", (f"{SB3}.a2c.a2c:A2C.train", *_ACTOR_CRITIC, *_ROLLOUT, _RATE, _MODE)),
    Replacement("collection:off_policy", (
        f"{SB3}.common.off_policy_algorithm:OffPolicyAlgorithm.collect_rollouts",
        f"{SB3}.common.off_policy_algorithm:OffPolicyAlgorithm._sample_action",
        f"{SB3}.common.off_policy_algorithm:OffPolicyAlgorithm._store_transition",
        f"{SB3}.dqn.dqn:DQN._on_step", f"{SB3}.dqn.dqn:DQN.predict", f"{SB3}.common.policies:BasePolicy.predict",
        f"{SB3}.dqn.policies:QNetwork._predict", f"{SB3}.sac.policies:Actor.forward",
        f"{SB3}.common.buffers:ReplayBuffer.add")),
    Replacement("collection:on_policy", (f"{SB3}.common.policies:ActorCriticPolicy.forward", *_ACTOR_CRITIC)),
)}

CODE = VerifiedCode(REPLACEMENTS, Path(__file__).with_name("verified.json"), ("stable-baselines3", "sb3-contrib"))


def train_key(model) -> str:
    """The replacement key of ``model``'s fused ``train``: the SB3 class whose ``train`` it runs."""
    owner = next(c for c in type(model).__mro__ if "train" in vars(c))
    return f"train:{owner.__name__}"
