"""`EnvStepCadence`: "every N env steps", the rhythm of evaluations and checkpoints."""

from __future__ import annotations


class EnvStepCadence:
    """Due at each multiple of ``every`` env steps (0: never); a resumed run goes on at the next multiple.

    Examples:
        >>> cadence = EnvStepCadence(every=100)
        >>> cadence.start(env_steps=250)
        >>> [cadence.due(s) for s in (260, 300, 350, 400)]
        [False, True, False, True]
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.next: int | None = every or None

    def start(self, env_steps: int) -> None:
        """Begin (or resume) at ``env_steps``: next due at the next multiple of ``every``."""
        self.next = (env_steps // self.every + 1) * self.every if self.every else None

    def due(self, env_steps: int) -> bool:
        """Whether ``env_steps`` reached the next multiple; if so the one after becomes next."""
        if self.next is not None and env_steps >= self.next:
            self.next += self.every
            return True
        return False
