"""Lean action selection for SB3's collection: the same actions, a fraction of the time.

SB3's ``collect_rollouts`` asks ``_sample_action`` for each vector step's action, which goes through
``model.predict`` → ``policy.predict``: the policy is switched to eval mode on every call (a walk over
every submodule), the observation is copied, checked and reshaped, and the forward pass runs. On
CartPole that is more than half of SB3's time per env step (``benchmarks/collect_bench.py --framework``).

:func:`lean_sample_action_for` returns a ``_sample_action`` with SB3's code path and RNG draws —
the warm-up's ``action_space.sample()`` per env, DQN/QR-DQN's ``np.random.rand()`` per vector step
and its per-env samples when exploring, action noise, the [-1, 1] rescaling of Box actions — that
differs only where no result depends on it: the eval-mode walk only when the policy is not in eval
mode already, and a plain Box observation (not an image, not a dict) of the VecEnv's shape used as a
tensor view instead of copied and re-checked. ``AccelerateCallback`` installs it for ``learn()``
(``training.fused_collection``); equivalence is tested step by step in ``tests/equivalence/test_sb3_collection.py``.

On-policy (PPO, A2C), ``collect_rollouts`` calls ``policy(obs)`` once per vector step:
:func:`rlaccel_sb3.flat_actor_critic.lean_policy_forward_for` gives an MLP policy with Discrete or Box
actions a ``forward`` of the same tensor ops and the same random draw, without module calls or
distribution objects (the fused PPO/A2C updates take their ``evaluate_actions`` from the same module).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gymnasium import spaces

from rlaccel_plugins.fused.module_cache import has_call_hooks, has_uninitialized
from rlaccel_sb3.flat_actor_critic import flat_q_values
from rlaccel_sb3.training_mode import set_training_mode


def lean_sample_action_for(model) -> Callable[..., tuple[np.ndarray, np.ndarray]] | None:
    """A lean ``_sample_action`` for ``model`` (SB3's signature), or None where there is no tested one
    (another algorithm, or a class that overrides ``_sample_action``, ``predict`` or the policy's
    ``predict``)."""
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
    from stable_baselines3.common.policies import BasePolicy

    from rlaccel_sb3.fused.registry import lean_collection_entry, q_learning_classes

    if lean_collection_entry(model) is None:
        return None
    if type(model)._sample_action is not OffPolicyAlgorithm._sample_action:
        return None
    if type(model).predict in tuple(cls.predict for cls, _ in q_learning_classes()):
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


def _policy_predict(model, epsilon_greedy: bool) -> Callable[[np.ndarray], np.ndarray]:
    """``model.predict(observation, deterministic=False)[0]`` for a VecEnv's observation."""
    from stable_baselines3.common.preprocessing import is_image_space

    policy, action_space = model.policy, model.action_space
    space = policy.observation_space
    plain_box = isinstance(space, spaces.Box) and not is_image_space(space)
    action_shape = (-1, *action_space.shape)
    # Q-networks cache nothing between calls, so their forward can run in inference mode (cheaper than
    # no_grad, the same kernels); actors keep distribution tensors that training reuses, and
    # a lazy module (LazyLinear...) would create its weights in its first forward as inference tensors,
    # which training cannot use
    no_grad = torch.inference_mode if epsilon_greedy and not has_uninitialized(policy) else torch.no_grad
    greedy = _flat_greedy(policy) if plain_box else None
    # BasePolicy.device lists every parameter to return the first one's device (every step); the first
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
    (each with its hook checks), or None where the network is anything else or has hooks."""
    from stable_baselines3.dqn.policies import DQNPolicy

    if not isinstance(policy, DQNPolicy) or has_call_hooks(policy):
        return None
    q_values = flat_q_values(policy.q_net)
    if q_values is None:
        return None
    return lambda observation: q_values(observation).argmax(dim=1).reshape(-1)
