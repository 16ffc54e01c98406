"""What ``training.fused_updates`` makes of an adapter's fused update for one algorithm."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import TypeVar

from rlaccel_plugins.errors import ConfigError, RlaccelWarning

T = TypeVar("T")
_REPORTED: set[tuple[str, ...]] = set()  # (framework, algorithm, key[, why]) already reported as running its own


def select_fused(setting: bool | str, fused: T | None, *, algorithm: str, framework: str,
                 supported: Sequence[str], key: str = "fused_updates", what: str = "update",
                 unverified: str | None = None) -> T | None:
    """``fused`` (the adapter's equivalence-tested update for ``algorithm``, or None where it has none)
    as ``setting`` allows: ``False`` → None; ``True`` → ``fused``, or a ``ConfigError`` where there is
    none; ``"auto"`` → ``fused``, with one log line per algorithm where there is none. ``key`` and
    ``what`` name the setting and the replaced part in those messages (``fused_collection``, ``collection``).

    ``unverified`` says why the installed framework code differs from the code ``fused`` was verified
    against (:mod:`rlaccel_plugins.fused.fingerprints`): then ``True`` refuses with a ``ConfigError`` and
    ``"auto"`` runs the framework's own, with one warning per algorithm.

    Examples:
        >>> select_fused("auto", len, algorithm="DQN", framework="SB3", supported=["DQN"]) is len
        True
        >>> select_fused(False, len, algorithm="DQN", framework="SB3", supported=["DQN"]) is None
        True
    """
    if setting is False:
        return None
    if fused is not None and unverified is not None:
        if setting is True:
            raise ConfigError(f"{key}=true needs {framework}'s code as rlaccel verified it, got changed code: "
                              f"{unverified} Fix: {key}=auto runs {framework}'s own {what} for it, or install a "
                              "verified version.")
        if (framework, algorithm, key, "unverified") not in _REPORTED:
            _REPORTED.add((framework, algorithm, key, "unverified"))
            warnings.warn(f"rlaccel: running {framework}'s own {what} for {algorithm} ({key}=auto): {unverified}",
                          RlaccelWarning, stacklevel=3)
        return None
    if fused is None and setting is True:
        raise ConfigError(f"{key}=true needs a fused {what} for the algorithm, got {algorithm}, which has "
                          f"none yet (fused: {', '.join(supported)}). Fix: {key}=auto runs {framework}'s "
                          f"own {what} where there is none.")
    if fused is None and (framework, algorithm, key) not in _REPORTED:
        _REPORTED.add((framework, algorithm, key))
        logging.getLogger("rlaccel").info("rlaccel: no fused %s for %s yet (fused: %s): %s's own runs",
                                          what, algorithm, ", ".join(supported), framework)
    return fused
