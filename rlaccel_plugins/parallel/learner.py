"""`Learner`: the learner side of chunked collection, which each adapter implements once.

Collection runs elsewhere (an actor thread, Ray actors) and arrives in chunks; a learner stores
each chunk through its framework's own bookkeeping and runs the framework's own updates as the
chunks earn them. The core loops (:func:`~rlaccel_plugins.parallel.ray_actors.feed_learner` for Ray)
talk to it through this protocol only.
"""

from __future__ import annotations

from typing import Any, Protocol


class Learner(Protocol):
    """What the core's collection loops need from an adapter's learner."""

    @property
    def finished(self) -> bool:
        """True once the budget is spent or training was asked to stop."""

    @property
    def gradient_steps(self) -> int:
        """Optimizer steps so far: the version of the weights the actors act with."""

    def store_chunk(self, payload: Any) -> int:
        """Store one chunk as its actor produced it and run the updates it earns; returns the
        transitions stored (0 once :attr:`finished`: a chunk past the budget is not stored)."""

    def weights(self) -> dict[str, Any]:
        """The acting policy's weights, on the CPU, for the actors."""

    def exploration(self) -> dict[str, Any]:
        """What travels with each collection request (e.g. the current epsilon)."""
