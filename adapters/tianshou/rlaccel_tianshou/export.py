"""`rlaccel export` for Tianshou: a policy's deterministic action as one ONNX graph.

``export_policy(policy, observation_space, path)`` works on a live Tianshou policy (a Q-learning policy:
argmax of its Q-network; an actor-critic policy: its actor's mode/mean, mapped to the action bounds as
the policy does). ``export(run_dir_or_algorithm_pt, path)`` rebuilds a model saved by
``rlaccel train --framework tianshou`` from the ``model.json`` written beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from gymnasium import spaces

from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.export import check_onnx, export_onnx, sample_observations


class QArgmax(torch.nn.Module):
    """obs -> argmax_a Q(obs, a) (Tianshou nets return ``(values, state)``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.model(obs)
        values = out[0] if isinstance(out, tuple) else out
        return values.argmax(dim=-1)


class ActorMode(torch.nn.Module):
    """obs -> the actor's deterministic action: argmax of logits (discrete) or the mean, bounded and
    scaled as ``policy.map_action`` does (continuous)."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.actor = policy.actor
        space = policy.action_space
        self.discrete = isinstance(space, spaces.Discrete)
        self.bound = getattr(policy, "action_bound_method", None)
        self.scaling = bool(getattr(policy, "action_scaling", False))
        self.squash = type(policy).__name__.startswith(("SAC", "REDQ"))  # these tanh-squash in forward()
        if not self.discrete:
            self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.actor(obs)
        head = out[0] if isinstance(out, tuple) else out
        if self.discrete:
            return head.argmax(dim=-1)
        action = head[0] if isinstance(head, tuple) else head  # (mu, sigma) -> mu
        if self.squash:
            action = torch.tanh(action)
        if self.bound == "clip":
            action = action.clamp(-1.0, 1.0)
        elif self.bound == "tanh":
            action = torch.tanh(action)
        if self.scaling:
            action = self.low + (self.high - self.low) * (action + 1.0) / 2.0
        return action


def action_module(policy: Any) -> torch.nn.Module:
    if hasattr(policy, "actor"):
        return ActorMode(policy)
    if hasattr(policy, "model"):
        return QArgmax(policy.model)
    raise ConfigError(f"policy must be a Tianshou Q-learning or actor policy, got {type(policy).__name__}.")


def export_policy(policy: Any, observation_space: spaces.Box, path: str | Path, check: int = 1000) -> dict[str, Any]:
    """Export ``policy``'s deterministic action to ``path``; check ``check`` observations in onnxruntime.

    Example (``tests/core/test_export.py`` runs it for DQN, PPO and SAC policies)::

        report = export_policy(algorithm.policy, env.observation_space, "policy.onnx")
    """
    module = action_module(policy)
    observations = sample_observations(observation_space, check).astype("float32")
    export_onnx(module, observations, path)
    return {"framework": "tianshou", "policy": type(policy).__name__, "onnx": str(path),
            **check_onnx(module, path, observations)}


def export(model_path: str | Path, onnx_path: str | Path, check: int = 1000) -> dict[str, Any]:
    """Export a DQN saved by ``rlaccel train --framework tianshou`` (``algorithm.pt`` + ``model.json``)."""
    import gymnasium as gym
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.utils.net.common import Net

    model_path = Path(model_path)
    if model_path.is_dir():
        model_path = model_path / "algorithm.pt"
    described = model_path.with_name("model.json")
    if not model_path.is_file() or not described.is_file():
        raise ConfigError(f"MODEL must be the algorithm.pt of an `rlaccel train --framework tianshou` run "
                          f"(with model.json beside it), got MODEL={str(model_path)!r}. For your own Tianshou "
                          "policy call rlaccel_tianshou.export.export_policy(policy, observation_space, path).")
    spec = json.loads(described.read_text())
    env = gym.make(spec["env_id"])
    net = Net(state_shape=spec["obs_dim"], action_shape=spec["n_actions"], hidden_sizes=spec["hidden_sizes"])
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space)
    state = torch.load(model_path, map_location="cpu", weights_only=True)
    prefix = "policy.model."
    net.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    return export_policy(policy, env.observation_space, onnx_path, check)
