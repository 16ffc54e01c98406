"""``policy.set_training_mode(mode)`` as flag writes on a kept list of modules.

SB3 puts the policy in train mode at the start of every ``train()`` and in eval mode at the start of
every ``collect_rollouts()``. ``Module.train`` walks the tree through ``children()`` and
``Module.__setattr__``, twice per env step at SAC's ``train_freq=1`` (``benchmarks/update_overheads.py``).
Where the policy's ``set_training_mode`` is SB3's own (``BaseModel``'s, or the SAC/TD3/DQN/QR-DQN
policies' that switch their actor and critic, or Q-network, and set their own flag) and no module
overrides ``train`` or ``__setattr__``, :func:`set_training_mode` writes the same ``training`` flags on
the same modules, from a list kept while the tree is unchanged
(:func:`rlaccel_plugins.fused.module_cache.cached`). Anything else calls the policy's own method.

Examples:
    >>> from stable_baselines3 import SAC
    >>> model = SAC("MlpPolicy", "Pendulum-v1")
    >>> set_training_mode(model.policy, True)
    >>> model.actor.training, model.critic.training, model.critic_target.training
    (True, True, False)
"""

from __future__ import annotations

import functools

import torch

from rlaccel_plugins.fused.module_cache import cached, flags_set_mode


def set_training_mode(policy: torch.nn.Module, mode: bool) -> None:
    """``policy.set_training_mode(mode)``: the same ``training`` flags on the same modules."""
    subtrees = _switched_subtrees(policy)
    if subtrees is None:
        policy.set_training_mode(mode)
        return
    for subtree in subtrees:
        modules = cached(subtree, "plain_modules", functools.partial(_plain_modules, subtree))
        if modules is None:
            subtree.train(mode)
            continue
        for module in modules:
            module.__dict__["training"] = mode  # what Module.train's `self.training = mode` stores
    policy.__dict__["training"] = mode


def _switched_subtrees(policy: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The modules SB3's own ``set_training_mode`` of ``policy`` calls ``train(mode)`` on; None for
    any other implementation."""
    from stable_baselines3.common.policies import BaseModel
    from stable_baselines3.dqn.policies import DQNPolicy
    from stable_baselines3.sac.policies import SACPolicy
    from stable_baselines3.td3.policies import TD3Policy

    if "set_training_mode" in policy.__dict__:  # set on the instance: that one runs
        return None
    method = type(policy).set_training_mode
    if method is BaseModel.set_training_mode:
        return [policy]
    names = {SACPolicy.set_training_mode: ("actor", "critic"), TD3Policy.set_training_mode: ("actor", "critic"),
             DQNPolicy.set_training_mode: ("q_net",), _qrdqn_method(): ("quantile_net",)}.get(method)
    if names is None:
        return None
    subtrees = [getattr(policy, name) for name in names]
    if any(type(s).set_training_mode is not BaseModel.set_training_mode or "set_training_mode" in s.__dict__
           for s in subtrees):
        return None
    return subtrees


@functools.cache
def _qrdqn_method():
    try:
        from sb3_contrib.qrdqn.policies import QRDQNPolicy
    except ImportError:  # sb3-contrib is optional
        return None
    return QRDQNPolicy.set_training_mode


def _plain_modules(root: torch.nn.Module) -> list[torch.nn.Module] | None:
    """``root``'s modules, or None where one overrides ``train`` or ``__setattr__`` (its own switch runs)."""
    modules = list(root.modules())
    return modules if flags_set_mode(modules) else None
