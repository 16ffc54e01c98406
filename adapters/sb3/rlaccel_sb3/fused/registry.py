"""The SB3 algorithms rlaccel has a fused update for: one entry each, the one place that says so.

From it come the dispatch (:func:`rlaccel_sb3.fused.trains`), ``SUPPORTED``, the compiled steps
(:func:`rlaccel_sb3.fused.compiled_unavailable`), which off-policy algorithms collect lean
(:mod:`rlaccel_sb3.collection`, :mod:`rlaccel_sb3.rollouts`), the framework code each update and the lean
collection are verified against (:mod:`rlaccel_sb3.verified`) and the docs' support table. Adding an algorithm is one entry here, its
builder in the family module, and its equivalence test (docs: Contributing). The builders are the family
modules' own functions; the framework code is named by strings (``module:qualname``), so that an algorithm
whose package is not installed (sb3-contrib's QR-DQN) is listed all the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

from rlaccel_sb3.fused.actor_critic import sac_train, td3_train
from rlaccel_sb3.fused.compiled_sac import CompiledSACStep
from rlaccel_sb3.fused.compiled_td3 import CompiledTD3Step
from rlaccel_sb3.fused.on_policy import a2c_train, compiled_a2c_step, compiled_ppo_step, ppo_train
from rlaccel_sb3.fused.value_based import compiled_dqn_step, compiled_qrdqn_step, dqn_train, qrdqn_train

SB3, CONTRIB = "stable_baselines3", "sb3_contrib"
_RATE = f"{SB3}.common.base_class:BaseAlgorithm._update_learning_rate"
_POLYAK = f"{SB3}.common.utils:polyak_update"
_REPLAY = (f"{SB3}.common.buffers:ReplayBuffer.sample", f"{SB3}.common.buffers:ReplayBuffer._get_samples")
_ROLLOUT = (f"{SB3}.common.buffers:RolloutBuffer.get", f"{SB3}.common.buffers:RolloutBuffer._get_samples")
_MODE = f"{SB3}.common.policies:BaseModel.set_training_mode"
_CRITIC = (f"{SB3}.common.policies:ContinuousCritic.forward", f"{SB3}.common.policies:ContinuousCritic.q1_forward")
ACTOR_CRITIC_POLICY = (f"{SB3}.common.policies:ActorCriticPolicy.evaluate_actions",
                 f"{SB3}.common.policies:ActorCriticPolicy._get_action_dist_from_latent",
                 f"{SB3}.common.policies:ActorCriticPolicy.extract_features",
                 f"{SB3}.common.torch_layers:MlpExtractor.forward")


@dataclass(frozen=True)
class FusedAlgorithm:
    """One SB3 algorithm whose ``train()`` rlaccel runs fused.

    ``build(model, graphs, fused_optimizer) -> train``: its family module's fused ``train``;
    ``compiled(model, compile=True) -> step | why not``: its compiled gradient step (None: none), which the
    fused ``train`` runs where ``training.compiled_updates`` says so. ``replaces``: the
    framework code the update computes as (fingerprinted in ``verified.json``). ``runs_for``: the
    algorithms that inherit this ``train`` (SB3's DDPG runs TD3's). ``break_even``: the gradient steps a
    ``learn()`` call must plan for ``compiled_updates: auto`` to compile (:func:`rlaccel_sb3.fused.compiled_pays`).
    ``collects``: for an off-policy algorithm whose collection runs lean, its own code that collection mirrors
    (empty: SB3's own collection). ``q_networks``: a Q-learning algorithm's online and target network
    attributes — its ``predict`` is epsilon-greedy and its ``_on_step`` updates the target, as the lean
    collection does.
    """

    name: str
    package: str
    build: Callable
    replaces: tuple[str, ...]
    compiled: Callable | None = None
    runs_for: tuple[str, ...] = ()
    break_even: int | None = None
    collects: tuple[str, ...] = ()
    q_networks: tuple[str, str] | None = None

    @property
    def family(self) -> str:
        """Its family module in ``rlaccel_sb3.fused`` (``value_based``, ``actor_critic``, ``on_policy``)."""
        return self.build.__module__.rsplit(".", 1)[-1]

    @property
    def key(self) -> str:
        """The key of its ``verified.json`` record."""
        return f"train:{self.name}"

    def algorithm_class(self) -> type | None:
        """The framework's class, or None when its package is not installed."""
        try:
            return getattr(import_module(self.package), self.name)
        except ImportError:
            return None

    def own_train(self) -> Callable | None:
        """The framework's ``train`` this replaces, or None when its package is not installed."""
        cls = self.algorithm_class()
        return cls.train if cls is not None else None


# compiled_updates: auto compiles a learn() call planning at least this many gradient steps: where loading the
# saved compiled step (about 2.5 s on a 2-core CPU) is paid back by what each compiled step saves against the
# eager fused one (DQN: 0.44 ms a step called alone, 0.8 ms in a loop; QR-DQN: 0.9 ms; SAC: 2.8 ms; TD3 at
# RL Zoo's 400x300: 1.4 ms of a 13 ms step; PPO: 1.5 ms a minibatch step in its loop). Numbers: the Compiled
# updates section of docs/fused.md. An algorithm gets one only after its learning check (docs/fused.md:
# Learning check and default); A2C has none yet.
DQN_BREAK_EVEN, QRDQN_BREAK_EVEN, SAC_BREAK_EVEN, TD3_BREAK_EVEN, PPO_BREAK_EVEN = 5_000, 2_500, 1_000, 2_500, 2_000

ALGORITHMS = (
    FusedAlgorithm("DQN", SB3, dqn_train,
                   (f"{SB3}.dqn.dqn:DQN.train", f"{SB3}.dqn.policies:QNetwork.forward", _RATE, _MODE, *_REPLAY),
                   compiled=compiled_dqn_step, break_even=DQN_BREAK_EVEN,
                   collects=(f"{SB3}.dqn.dqn:DQN._on_step", f"{SB3}.dqn.dqn:DQN.predict",
                             f"{SB3}.dqn.policies:QNetwork._predict"), q_networks=("q_net", "q_net_target")),
    FusedAlgorithm("QRDQN", CONTRIB, qrdqn_train,
                   (f"{CONTRIB}.qrdqn.qrdqn:QRDQN.train", f"{CONTRIB}.qrdqn.policies:QuantileNetwork.forward",
                    f"{CONTRIB}.common.utils:quantile_huber_loss", _RATE, _MODE, *_REPLAY),
                   compiled=compiled_qrdqn_step, break_even=QRDQN_BREAK_EVEN,
                   collects=(f"{CONTRIB}.qrdqn.qrdqn:QRDQN._on_step", f"{CONTRIB}.qrdqn.qrdqn:QRDQN.predict",
                             f"{CONTRIB}.qrdqn.policies:QuantileNetwork._predict"),
                   q_networks=("quantile_net", "quantile_net_target")),
    FusedAlgorithm("SAC", SB3, sac_train,
                   (f"{SB3}.sac.sac:SAC.train", f"{SB3}.sac.policies:Actor.action_log_prob",
                    f"{SB3}.sac.policies:Actor.get_action_dist_params",
                    f"{SB3}.common.distributions:SquashedDiagGaussianDistribution.log_prob",
                    f"{SB3}.common.distributions:SquashedDiagGaussianDistribution.log_prob_from_params",
                    *_CRITIC, _POLYAK, _RATE, _MODE, *_REPLAY),
                   compiled=CompiledSACStep.build, break_even=SAC_BREAK_EVEN,
                   collects=(f"{SB3}.sac.policies:Actor.forward",)),
    FusedAlgorithm("TD3", SB3, td3_train,
                   (f"{SB3}.td3.td3:TD3.train", f"{SB3}.td3.policies:Actor.forward", *_CRITIC, _POLYAK, _RATE, _MODE,
                    *_REPLAY), compiled=CompiledTD3Step.build, runs_for=("DDPG",),
                   break_even=TD3_BREAK_EVEN, collects=(f"{SB3}.td3.policies:Actor.forward",)),
    FusedAlgorithm("PPO", SB3, ppo_train,
                   (f"{SB3}.ppo.ppo:PPO.train", *ACTOR_CRITIC_POLICY, *_ROLLOUT, _RATE, _MODE),
                   compiled=compiled_ppo_step, break_even=PPO_BREAK_EVEN),
    FusedAlgorithm("A2C", SB3, a2c_train,
                   (f"{SB3}.a2c.a2c:A2C.train", *ACTOR_CRITIC_POLICY, *_ROLLOUT, _RATE, _MODE),
                   compiled=compiled_a2c_step),
)

# the algorithms with an equivalence-tested fused train(), those that inherit one included
SUPPORTED = tuple(name for a in ALGORITHMS for name in (a.name, *a.runs_for))
COMPILED = tuple(a.name for a in ALGORITHMS if a.compiled)
# the off-policy code every lean collection runs in SB3's place, whatever the algorithm
OFF_POLICY_COLLECTION = (f"{SB3}.common.off_policy_algorithm:OffPolicyAlgorithm.collect_rollouts",
                         f"{SB3}.common.off_policy_algorithm:OffPolicyAlgorithm._sample_action",
                         f"{SB3}.common.off_policy_algorithm:OffPolicyAlgorithm._store_transition",
                         f"{SB3}.common.policies:BasePolicy.predict", f"{SB3}.common.buffers:ReplayBuffer.add")


def lean_collection_entry(model) -> FusedAlgorithm | None:
    """The entry whose off-policy lean collection ``model`` gets (its class or an ancestor's; DDPG is a TD3),
    or None where it collects as SB3 does."""
    return next((a for a in ALGORITHMS if a.collects and (cls := a.algorithm_class()) is not None
                 and isinstance(model, cls)), None)


def q_learning_classes() -> tuple[tuple[type, FusedAlgorithm], ...]:
    """The installed Q-learning classes (epsilon-greedy ``predict``, target update in ``_on_step``), with their entries."""
    return tuple((cls, a) for a in ALGORITHMS if a.q_networks and (cls := a.algorithm_class()) is not None)


def support_markdown() -> str:
    """The docs' table: each algorithm, its family module, what runs compiled, the code it is verified against."""
    rows = ["| algorithm | fused update (`rlaccel_sb3.fused`) | compiled step (`auto` from) | replaces (verified) |",
            "|---|---|---|---|"]
    for a in ALGORITHMS:
        names = " / ".join((a.name, *a.runs_for))
        compiled = f"yes ({a.break_even:,} gradient steps)" if a.compiled and a.break_even else "yes" if a.compiled else "—"
        rows.append(f"| {names} | `{a.family}` | {compiled} | "
                    f"`{a.replaces[0].split(':')[1]}` and {len(a.replaces) - 1} more |")
    return "\n".join(rows)
