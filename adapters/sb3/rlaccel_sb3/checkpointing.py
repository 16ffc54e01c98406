"""Crash-safe checkpoints and resume for `rlaccel train --framework sb3`.

A checkpoint holds SB3's own ``model.zip`` (weights, optimizer states, counters, exploration), the
replay buffer (``replay.pkl``, tiers and sampler RNG included) and ``state.pt``: the sparse/dense
schedule, the evaluation curve and training clock, and the global RNG states. Env states are not
saved: a resumed run starts fresh episodes.
"""

from __future__ import annotations

from typing import Any

import torch
from stable_baselines3.common.callbacks import BaseCallback

from rlaccel_plugins.checkpoint import CheckpointSchedule, restore_rng, rng_state, store_for
from rlaccel_plugins.training import EvalClock, TrainSpec


class CheckpointCallback(BaseCallback):
    """Checkpoint every ``checkpoint.every_steps`` env steps, and on SIGTERM/SIGINT (then stop)."""

    def __init__(self, spec: TrainSpec, clock: EvalClock, sparse: Any = None) -> None:
        super().__init__()
        self.spec, self.clock, self.sparse = spec, clock, sparse
        self.store = store_for(spec)
        self.schedule = CheckpointSchedule(spec.config.checkpoint.every_steps, spec.stop)
        self.last = None

    def _on_training_start(self) -> None:
        self.schedule.start(self.num_timesteps)

    def _on_step(self) -> bool:
        due = self.schedule.due(self.num_timesteps)
        if due is not None:
            self.save()
        return due != "signal"

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
