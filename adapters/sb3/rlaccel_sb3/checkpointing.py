"""Crash-safe checkpoints and resume for `rlaccel train --framework sb3`.

A checkpoint holds SB3's own ``model.zip`` (weights, optimizer states, counters, exploration), the
replay buffer (``replay.pkl``, tiers and sampler RNG included) and ``state.pt``: the sparse/dense
schedule, the evaluation curve and training clock, and the global RNG states. Env states are not
saved: a resumed run starts fresh episodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.callbacks import BaseCallback

from rlaccel_plugins.checkpoint import CheckpointStore, restore_rng, rng_state
from rlaccel_plugins.training import EvalClock, TrainSpec


def store_for(spec: TrainSpec) -> CheckpointStore:
    return CheckpointStore(Path(spec.logdir) / "checkpoints", keep=spec.config.checkpoint.keep)



class CheckpointCallback(BaseCallback):
    """Checkpoint every ``checkpoint.every_steps`` env steps, and on SIGTERM/SIGINT (then stop)."""

    def __init__(self, spec: TrainSpec, clock: EvalClock, sparse: Any = None) -> None:
        super().__init__()
        self.spec, self.clock, self.sparse = spec, clock, sparse
        self.store = store_for(spec)
        self.every = spec.config.checkpoint.every_steps
        self.last = None
        self._next = None

    def _on_training_start(self) -> None:
        if self.every:
            self._next = (self.num_timesteps // self.every + 1) * self.every

    def _on_step(self) -> bool:
        signal = self.spec.stop.received if self.spec.stop is not None else None
        if signal is not None:
            self.save()
            return False
        if self._next is not None and self.num_timesteps >= self._next:
            self._next += self.every
            self.save()
        return True

    def save(self):
        model = self.model
        state = {"clock": self.clock.state(), "sparse": self.sparse.state_dict() if self.sparse else None,
                 "rng": rng_state()}
        writers = {"model.zip": lambda p: model.save(p),
                   "state.pt": lambda p: torch.save(state, p)}
        if getattr(model, "replay_buffer", None) is not None:
            writers["replay.pkl"] = lambda p: model.save_replay_buffer(p)
        self.last = self.store.save(model.num_timesteps, writers, meta={"env_steps": model.num_timesteps})
        return self.last


def resume(spec: TrainSpec, cls, env, clock: EvalClock, sparse: Any = None):
    """Load the newest valid checkpoint of ``spec.logdir`` into a new model; returns (model, checkpoint)."""
    checkpoint = store_for(spec).require_latest()
    model = cls.load(checkpoint.path / "model.zip", env=env, device="cpu")
    if (checkpoint.path / "replay.pkl").exists():
        model.load_replay_buffer(checkpoint.path / "replay.pkl")
    state = torch.load(checkpoint.path / "state.pt", weights_only=False)
    clock.restore(state["clock"])
    if sparse is not None and state["sparse"] is not None:
        sparse.load_state_dict(state["sparse"])
    restore_rng(state["rng"])
    model._last_obs = None  # the env is new: start fresh episodes
    return model, checkpoint
