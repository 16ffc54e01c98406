"""What ``training.fused_updates`` makes of an adapter's fused update for one algorithm."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

from rlaccel_plugins.errors import ConfigError

T = TypeVar("T")
_REPORTED: set[tuple[str, str]] = set()  # (framework, algorithm) already reported as running its own update


def select_fused(setting: bool | str, fused: T | None, *, algorithm: str, framework: str,
                 supported: Sequence[str]) -> T | None:
    """``fused`` (the adapter's equivalence-tested update for ``algorithm``, or None where it has none)
    as ``setting`` allows: ``False`` → None; ``True`` → ``fused``, or a ``ConfigError`` where there is
    none; ``"auto"`` → ``fused``, with one log line per algorithm where there is none.

    Examples:
        >>> select_fused("auto", len, algorithm="DQN", framework="SB3", supported=["DQN"]) is len
        True
        >>> select_fused(False, len, algorithm="DQN", framework="SB3", supported=["DQN"]) is None
        True
    """
    if setting is False:
        return None
    if fused is None and setting is True:
        raise ConfigError(f"fused_updates=true needs a fused update for the algorithm, got {algorithm}, which has "
                          f"none yet (fused: {', '.join(supported)}). Fix: fused_updates=auto runs {framework}'s "
                          "own update where there is none.")
    if fused is None and (framework, algorithm) not in _REPORTED:
        _REPORTED.add((framework, algorithm))
        logging.getLogger("rlaccel").info("rlaccel: no fused update for %s yet (fused: %s): %s's own runs",
                                          algorithm, ", ".join(supported), framework)
    return fused
