"""Crash-safe checkpoints and resume for `rlaccel train --framework tianshou`.

A checkpoint holds ``algorithm.pt`` (Tianshou's ``state_dict``: networks, optimizer states and
rlaccel's schedule), ``replay.pkl`` (the whole buffer, tiers and sampler RNG included) and
``state.pt`` (env-step count, exploration, evaluation curve, training clock, RNG states). Env states
are not saved: a resumed run starts fresh episodes.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

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


class StoppedBySignal(Exception):
    """Raised inside Tianshou's trainer loop to leave it after a signal-triggered checkpoint."""



class Checkpoints:
    """Periodic and signal-triggered checkpoints of one run, and its resume."""

    def __init__(self, spec: TrainSpec, algorithm: Any, clock: EvalClock) -> None:
        self.spec, self.algorithm, self.clock = spec, algorithm, clock
        self.store = store_for(spec) if spec.logdir else None
        self.schedule = schedule_for(spec)
        self.buffer: Any = None
        self.last: Checkpoint | None = None

    def start(self, buffer: Any, env_steps: int) -> None:
        self.buffer = buffer
        self.schedule.start(env_steps)

    def resume(self) -> tuple[Any, dict[str, Any]]:
        """Load the newest checkpoint whose weights and buffer load back as saved: returns (buffer, saved
        state); restores weights, clock and RNG."""

        def load(checkpoint: Checkpoint):
            self.algorithm.load_state_dict(load_state(checkpoint.path / "algorithm.pt"))
            with open(checkpoint.path / "replay.pkl", "rb") as f:
                return pickle.load(f)

        first = self.spec.resume_from or self.store.require_latest()
        buffer, checkpoint, digests = load_verified(self.store, first, load, self._digests)
        state = load_state(checkpoint.path / "state.pt")
        self.clock.restore(state["clock"])
        restore_rng(state["rng"])
        note_resume(self.spec.logdir, checkpoint, state["env_steps"], digests)
        return buffer, state

    def _digests(self, buffer: Any) -> dict[str, str]:
        """What a resume verifies: the algorithm's weights (optimizer state included) and the buffer's arrays."""
        return {"weights": state_digest(self.algorithm.state_dict()), "buffer": state_digest(buffer)}

    def poll(self, env_steps: int, extra: dict[str, Any] | None = None) -> None:
        """Call between collection steps: checkpoints when due, and on a signal checkpoints then raises."""
        if self.store is None:
            return
        due = self.schedule.due(env_steps)
        if due is not None:
            self.save(env_steps, extra)
        if due == "signal":
            raise StoppedBySignal(self.spec.stop.received)

    def finish(self, env_steps: int, extra: dict[str, Any] | None = None) -> None:
        """The end of training: a last checkpoint, at the final step, where checkpoints are on."""
        if self.store is not None and self.schedule.due_at_end(env_steps, self.last):
            self.save(env_steps, extra)

    def save(self, env_steps: int, extra: dict[str, Any] | None = None) -> Checkpoint:
        state = {"env_steps": env_steps, "clock": self.clock.state(), **(extra or {}),
                 "rng": rng_state()}
        algorithm, buffer = self.algorithm, self.buffer

        def write_buffer(path: Path) -> None:
            with open(path, "wb") as f:
                pickle.dump(buffer, f, protocol=pickle.HIGHEST_PROTOCOL)

        self.last = self.store.save(env_steps, {
            "algorithm.pt": lambda p: torch.save(algorithm.state_dict(), p),
            "replay.pkl": write_buffer,
            "state.pt": lambda p: torch.save(state, p)}, meta={"env_steps": env_steps, "digests": self._digests(buffer)})
        return self.last
