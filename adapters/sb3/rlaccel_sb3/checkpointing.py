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

from rlaccel_plugins.checkpoint import (
    Checkpoint,
    load_state,
    load_verified,
    note_resume,
    restore_rng,
    rng_state,
    schedule_for,
    state_digest,
    store_for,
)
from rlaccel_plugins.training import EvalClock, TrainSpec


class Checkpoints:
    """Periodic and signal-triggered checkpoints of one SB3 run, and its resume (the shape of the
    Tianshou adapter's ``Checkpoints``; SB3's loop reaches it through :class:`CheckpointCallback`)."""

    def __init__(self, spec: TrainSpec, clock: EvalClock, sparse: Any = None) -> None:
        self.spec, self.clock, self.sparse = spec, clock, sparse
        self.store = store_for(spec) if spec.logdir else None
        self.schedule = schedule_for(spec)
        self.last: Checkpoint | None = None

    def start(self, env_steps: int) -> None:
        self.schedule.start(env_steps)

    def resume(self, cls, env):
        """Load the newest checkpoint whose weights and buffer load back as saved into a new model;
        returns (model, checkpoint)."""

        def load(checkpoint: Checkpoint):
            model = cls.load(checkpoint.path / "model.zip", env=env, device="cpu")
            if (checkpoint.path / "replay.pkl").exists():
                model.load_replay_buffer(checkpoint.path / "replay.pkl")
            return model

        first = self.spec.resume_from or self.store.require_latest()
        model, checkpoint, digests = load_verified(self.store, first, load, _digests)
        state = load_state(checkpoint.path / "state.pt")
        self.clock.restore(state["clock"])
        if self.sparse is not None and state["sparse"] is not None:
            self.sparse.load_state_dict(state["sparse"])
        restore_rng(state["rng"])
        model._last_obs = None  # the env is new: start fresh episodes
        note_resume(self.spec.logdir, checkpoint, model.num_timesteps, digests)
        return model, checkpoint

    def poll(self, model) -> bool:
        """Call after each env step: checkpoints when due; False after a signal's checkpoint (stop)."""
        if self.store is None:
            return True
        due = self.schedule.due(model.num_timesteps)
        if due is not None:
            self.save(model)
        return due != "signal"

    def finish(self, model) -> None:
        """The end of training: a last checkpoint, at the final step, where checkpoints are on."""
        if self.store is not None and self.schedule.due_at_end(model.num_timesteps, self.last):
            self.save(model)

    def save(self, model) -> Checkpoint:
        state = {"clock": self.clock.state(), "sparse": self.sparse.state_dict() if self.sparse else None,
                 "rng": rng_state()}
        writers = {"model.zip": lambda p: model.save(p),
                   "state.pt": lambda p: torch.save(state, p)}
        if getattr(model, "replay_buffer", None) is not None:
            writers["replay.pkl"] = lambda p: model.save_replay_buffer(p)
        meta = {"env_steps": model.num_timesteps, "digests": _digests(model)}
        self.last = self.store.save(model.num_timesteps, writers, meta=meta)
        return self.last


def _digests(model) -> dict[str, str]:
    """What a resume verifies: the policy's weights and the replay buffer's arrays."""
    digests = {"weights": state_digest(model.policy.state_dict())}
    if getattr(model, "replay_buffer", None) is not None:
        digests["buffer"] = state_digest(model.replay_buffer)
    return digests


class CheckpointCallback(BaseCallback):
    """Polls :class:`Checkpoints` after every env step (SB3's loop offers no other seam)."""

    def __init__(self, checkpoints: Checkpoints) -> None:
        super().__init__()
        self.checkpoints = checkpoints

    def _on_training_start(self) -> None:
        self.checkpoints.start(self.num_timesteps)

    def _on_step(self) -> bool:
        return self.checkpoints.poll(self.model)
