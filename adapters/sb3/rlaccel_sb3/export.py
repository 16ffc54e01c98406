"""`rlaccel export` for SB3: a saved model's deterministic ``predict`` as one ONNX graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.save_util import load_from_zip_file

from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.export import check_onnx, export_onnx, sample_observations


class DeterministicAction(torch.nn.Module):
    """``obs -> action`` exactly as ``model.predict(obs, deterministic=True)`` computes it: the policy's
    preprocessing and network, then clipping (or un-squashing) for Box action spaces."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy
        space = policy.action_space
        self.box = isinstance(space, spaces.Box)
        self.squash = bool(getattr(policy, "squash_output", False))
        if self.box:
            self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        action = self.policy._predict(obs, deterministic=True)
        if not self.box:
            return action
        if self.squash:  # SAC/TD3: tanh output in [-1, 1] -> the env's bounds
            return self.low + 0.5 * (action + 1.0) * (self.high - self.low)
        return torch.maximum(torch.minimum(action, self.high), self.low)


def load_policy(path: str | Path):
    """The policy of an SB3 ``.zip`` without knowing its algorithm class."""
    try:
        data, params, _ = load_from_zip_file(str(path), device="cpu")
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"MODEL must be an SB3 model .zip, got MODEL={str(path)!r}: {exc}") from None
    if not data or "policy_class" not in data or "policy" not in (params or {}):
        raise ConfigError(f"MODEL must be an SB3 model .zip saved by model.save(), got MODEL={str(path)!r} "
                          "(no policy inside).")
    policy = data["policy_class"](data["observation_space"], data["action_space"], lambda _: 0.0,
                                  **data.get("policy_kwargs", {}))
    policy.load_state_dict(params["policy"])
    policy.set_training_mode(False)
    return policy


def export(model_path: str | Path, onnx_path: str | Path, check: int = 1000) -> dict[str, Any]:
    """Export ``model_path`` to ``onnx_path`` and check ``check`` observations against onnxruntime."""
    policy = load_policy(model_path)
    module = DeterministicAction(policy)
    space = policy.observation_space
    if not isinstance(space, spaces.Box):
        raise ConfigError(f"export needs a Box observation space, got {type(space).__name__}: "
                          "Dict/Discrete observations are not exported yet.")
    observations = sample_observations(space, check).astype(space.dtype, copy=False)
    export_onnx(module, observations, onnx_path)
    report = check_onnx(module, onnx_path, observations)
    return {"framework": "sb3", "policy": type(policy).__name__, "onnx": str(onnx_path), **report,
            "observation_shape": list(space.shape), "observation_dtype": str(np.dtype(space.dtype))}
