"""Lean action selection for SB3's collection: the same actions, a fraction of the time.

SB3's ``collect_rollouts`` asks ``_sample_action`` for each vector step's action, which goes through
``model.predict`` → ``policy.predict``: the policy is switched to eval mode on every call (a walk over
every submodule, ~21 µs for DQN's two Q-networks), the observation is copied, checked and reshaped
(~10 µs), and the forward pass runs. On CartPole that is ~100 µs of SB3's ~175 µs per env step.

:func:`lean_sample_action_for` returns a ``_sample_action`` with SB3's code path and RNG draws —
the warm-up's ``action_space.sample()`` per env, DQN/QR-DQN's ``np.random.rand()`` per vector step
and its per-env samples when exploring, action noise, the [-1, 1] rescaling of Box actions — that
differs only where no result depends on it: the eval-mode walk only when the policy is not in eval
mode already, and a plain Box observation (not an image, not a dict) of the VecEnv's shape used as a
tensor view instead of copied and re-checked. ``AccelerateCallback`` installs it for ``learn()``
(``training.fused_collection``); equivalence is tested step by step in ``tests/equivalence/test_sb3_collection.py``.

On-policy (PPO, A2C), ``collect_rollouts`` calls ``policy(obs)`` once per vector step:
:func:`lean_policy_forward_for` gives an MLP policy with Discrete or Box actions a ``forward`` of the
same tensor ops and the same random draw, without module calls or distribution objects.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.distributions import sum_independent_dims

from rlaccel_plugins.fused.distributions import FlatCategorical, normal_rsample
from rlaccel_plugins.fused.flat import flat_layers
from rlaccel_plugins.fused.module_cache import cached, has_call_hooks, has_uninitialized
from rlaccel_sb3.flat_actor_critic import flat_q_values, gaussian_log_prob
from rlaccel_sb3.training_mode import set_training_mode

SUPPORTED = ("DQN", "QRDQN", "SAC", "TD3", "DDPG", "PPO", "A2C")  # PPO/A2C: MLP policy, no gSDE


def lean_sample_action_for(model) -> Callable[..., tuple[np.ndarray, np.ndarray]] | None:
    """A lean ``_sample_action`` for ``model`` (SB3's signature), or None where there is no tested one
    (another algorithm, or a class that overrides ``_sample_action``, ``predict`` or the policy's
    ``predict``)."""
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
    from stable_baselines3.common.policies import BasePolicy

    if not isinstance(model, (DQN, SAC, TD3, *_qrdqn())):  # DDPG is a TD3
        return None
    if type(model)._sample_action is not OffPolicyAlgorithm._sample_action:
        return None
    if type(model).predict in _epsilon_greedy_predicts():
        epsilon_greedy = True
    elif type(model).predict is BaseAlgorithm.predict:
        epsilon_greedy = False
    else:
        return None
    if type(model.policy).predict is not BasePolicy.predict:
        return None
    predict = _policy_predict(model, epsilon_greedy)

    def _sample_action(learning_starts: int, action_noise=None, n_envs: int = 1) -> tuple[np.ndarray, np.ndarray]:
        # SB3's OffPolicyAlgorithm._sample_action, line for line, with the lean predict
        if model.num_timesteps < learning_starts and not (model.use_sde and model.use_sde_at_warmup):
            unscaled_action = np.array([model.action_space.sample() for _ in range(n_envs)])
        else:
            unscaled_action = predict(model._last_obs)
        if isinstance(model.action_space, spaces.Box):
            scaled_action = model.policy.scale_action(unscaled_action)
            if action_noise is not None:
                scaled_action = np.clip(scaled_action + action_noise(), -1, 1)
            buffer_action = scaled_action
            action = model.policy.unscale_action(scaled_action)
        else:
            buffer_action = unscaled_action
            action = buffer_action
        return action, buffer_action

    _sample_action.__doc__ = f"rlaccel's lean {type(model).__name__}._sample_action (same actions, fewer ops)"
    return _sample_action


def _qrdqn() -> tuple:
    try:
        from sb3_contrib import QRDQN
    except ImportError:  # sb3-contrib is optional
        return ()
    return (QRDQN,)


def _epsilon_greedy_predicts() -> tuple:
    from stable_baselines3 import DQN

    return (DQN.predict, *(cls.predict for cls in _qrdqn()))


def _policy_predict(model, epsilon_greedy: bool) -> Callable[[np.ndarray], np.ndarray]:
    """``model.predict(observation, deterministic=False)[0]`` for a VecEnv's observation."""
    from stable_baselines3.common.preprocessing import is_image_space

    policy, action_space = model.policy, model.action_space
    space = policy.observation_space
    plain_box = isinstance(space, spaces.Box) and not is_image_space(space)
    action_shape = (-1, *action_space.shape)
    # Q-networks cache nothing between calls, so their forward can run in inference mode (~7 µs less
    # than no_grad here, the same kernels); actors keep distribution tensors that training reuses, and
    # a lazy module (LazyLinear...) would create its weights in its first forward as inference tensors,
    # which training cannot use
    no_grad = torch.inference_mode if epsilon_greedy and not has_uninitialized(policy) else torch.no_grad
    greedy = _flat_greedy(policy) if plain_box else None
    # BasePolicy.device lists every parameter to return the first one's device (~8 µs a step); the first
    # parameter itself follows the policy to any device (Module.to moves its data in place)
    first_parameter = next(policy.parameters(), None)

    def predict(observation) -> np.ndarray:
        if epsilon_greedy and np.random.rand() < model.exploration_rate:  # DQN.predict's exploration
            if policy.is_vectorized_observation(observation):
                if isinstance(observation, dict):
                    n_batch = observation[next(iter(observation.keys()))].shape[0]
                else:
                    n_batch = observation.shape[0]
                return np.array([action_space.sample() for _ in range(n_batch)])
            return np.array(action_space.sample())
        if policy.training:  # BasePolicy.predict switches to eval mode on every call; once is enough
            set_training_mode(policy, False)
        if plain_box and type(observation) is np.ndarray and observation.ndim == len(space.shape) + 1 \
                and observation.shape[1:] == space.shape:
            device = policy.device if first_parameter is None else first_parameter.device
            obs_tensor, vectorized = torch.as_tensor(observation, device=device), True
        else:
            obs_tensor, vectorized = policy.obs_to_tensor(observation)
        with no_grad():
            actions = greedy(obs_tensor) if greedy is not None else policy._predict(obs_tensor, deterministic=False)
        actions = actions.cpu().numpy().reshape(action_shape)
        if isinstance(action_space, spaces.Box):
            if policy.squash_output:
                actions = policy.unscale_action(actions)
            else:
                actions = np.clip(actions, action_space.low, action_space.high)
        if not vectorized:
            actions = actions.squeeze(axis=0)
        return actions

    return predict


def _flat_greedy(policy) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """SB3's DQN ``q_net._predict`` on a plain-Box observation — ``preprocess_obs`` (``.float()``),
    ``Flatten``, the ``Sequential`` MLP, ``argmax`` — as the same tensor ops without the nine module calls
    (~3 µs of hook checks each), or None where the network is anything else or has hooks."""
    from stable_baselines3.dqn.policies import DQNPolicy

    if not isinstance(policy, DQNPolicy) or has_call_hooks(policy):
        return None
    q_values = flat_q_values(policy.q_net)
    if q_values is None:
        return None
    return lambda observation: q_values(observation).argmax(dim=1).reshape(-1)


# ---------------------------------------------------------------------------------------- on-policy
def lean_policy_forward_for(model) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """A lean ``policy.forward`` for PPO/A2C's collection (SB3's ``ActorCriticPolicy.forward``: values,
    sampled actions and their log-probabilities) for an MLP policy on a 1-D Box observation, with a
    Discrete action space (SB3's ``Categorical``: the same ``torch.multinomial`` draw) or a Box one
    (its diagonal Gaussian: the same ``normal_`` draw), as the same tensor ops without the module calls
    and the distribution objects. None elsewhere (gSDE, images, dicts, other distributions)."""
    parts = _flat_actor_critic(model)
    if parts is None:
        return None
    actor, critic, categorical_actions = parts
    policy = model.policy
    action_shape = (-1, *model.action_space.shape)

    def categorical(logits: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        distribution = FlatCategorical(logits)
        actions = torch.argmax(distribution.probs, dim=1) if deterministic else distribution.sample()
        return actions, distribution.log_prob(actions)

    def gaussian(mean: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        std = _gaussian_std(policy, mean)
        if deterministic:
            actions = mean
        else:
            actions = normal_rsample(mean, std)
        return actions, gaussian_log_prob(actions, mean, std)

    sample = categorical if categorical_actions else gaussian

    def forward(obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = obs.float()
        values = critic(features)
        actions, log_prob = sample(actor(features), deterministic)
        return actions.reshape(action_shape), values, log_prob

    forward.__doc__ = f"rlaccel's lean {type(policy).__name__}.forward for collection (same ops, no module calls)"
    return forward


def lean_evaluate_actions_for(model) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """A lean ``policy.evaluate_actions(obs, actions)`` for PPO's and A2C's updates (values, log-probabilities of the
    actions, entropies), for the policies :func:`lean_policy_forward_for` serves: the same tensor ops —
    torch's ``Categorical`` (normalised logits, ``gather``, the clamped entropy over ``softmax``) or
    SB3's diagonal Gaussian (``Normal.log_prob`` and ``Normal.entropy`` summed over action dims) — so
    the same values and autograd graph, without module calls or distribution objects (nor their
    argument validation: a NaN logit reaches the loss, where the gradient guard sees it, instead of
    raising in ``Categorical``). None where a forward hook is registered (see :func:`evaluate_actions_of`)."""
    parts = _flat_actor_critic(model)
    if parts is None or "evaluate_actions" in model.policy.__dict__:  # a user's own stays
        return None
    actor, critic, categorical_actions = parts
    policy = model.policy

    def categorical(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        distribution = FlatCategorical(logits)  # log-probability first, as SB3 asks: probs made after it
        return distribution.log_prob(actions), distribution.entropy()

    def gaussian(mean: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        std = _gaussian_std(policy, mean)
        # log-probability before entropy, as SB3 asks them: the order autograd sums std's gradients in
        log_prob = gaussian_log_prob(actions, mean, std)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + torch.log(std)  # Normal.entropy
        return log_prob, sum_independent_dims(entropy)

    distribution = categorical if categorical_actions else gaussian

    def evaluate_actions(obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = obs.float()
        log_prob, entropy = distribution(actor(features), actions)
        return critic(features), log_prob, entropy

    return evaluate_actions


def evaluate_actions_of(model) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The ``evaluate_actions`` a fused PPO/A2C update calls: :func:`lean_evaluate_actions_for`'s, kept
    while the policy's module tree stays as it is (``module_cache``; a per-call build is ~20 µs, a
    fifth of A2C's one-step update), else the policy's own (a user's override included)."""
    policy = model.policy
    if "evaluate_actions" in policy.__dict__:
        return policy.evaluate_actions
    return cached(policy, "sb3.evaluate_actions", lambda: lean_evaluate_actions_for(model)) or policy.evaluate_actions


def _gaussian_std(policy, mean: torch.Tensor) -> torch.Tensor:
    """SB3's ``DiagGaussianDistribution.proba_distribution`` standard deviation."""
    return torch.ones_like(mean) * policy.log_std.exp()


def _flat_actor_critic(model) -> tuple[Callable, Callable, bool] | None:
    """The actor (to the action logits or means) and the critic (to the values) of an on-policy MLP policy
    — SB3's ``ActorCriticPolicy`` on a 1-D Box, shared flatten extractor, no gSDE, Categorical or diagonal
    Gaussian actions — as flat functions, and whether the actions are categorical; None elsewhere or
    where a forward hook is registered."""
    from stable_baselines3.common.distributions import CategoricalDistribution, DiagGaussianDistribution
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor

    policy = model.policy
    distribution = type(getattr(policy, "action_dist", None))
    if not isinstance(model, OnPolicyAlgorithm) or type(policy) is not ActorCriticPolicy or model.use_sde \
            or not policy.share_features_extractor or type(policy.features_extractor) is not FlattenExtractor \
            or type(policy.mlp_extractor) is not MlpExtractor \
            or distribution not in (CategoricalDistribution, DiagGaussianDistribution) \
            or not isinstance(policy.observation_space, spaces.Box) or len(policy.observation_space.shape) != 1:
        return None
    extractor, mlp = policy.features_extractor, policy.mlp_extractor
    hooked = [policy, extractor, extractor.flatten, mlp]
    actor = flat_layers(hooked, mlp.policy_net, policy.action_net)
    critic = flat_layers(hooked, mlp.value_net, policy.value_net)
    if actor is None or critic is None:
        return None
    return actor, critic, distribution is CategoricalDistribution
