"""Exceptions, warnings and message helpers shared by the whole package."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration value is invalid.

    The message always names the parameter and the value, and says how to fix it:
    ``sampling_ratio must sum to 1, got sampling_ratio=[0.7, 0.2].``
    """


class RlaccelWarning(UserWarning):
    """Base class of the warnings rlaccel emits (the test suite turns them into errors)."""


# optional packages and the extra of rlaccel-plugins that installs each
EXTRAS = {"stable_baselines3": "sb3", "sb3_contrib": "sb3", "gymnasium": "sb3", "tianshou": "tianshou",
          "envpool": "envpool", "ale_py": "atari", "cv2": "atari", "tensorboard": "logging", "rich": "logging",
          "tqdm": "logging", "onnx": "onnx", "onnxruntime": "onnx", "ray": "ray", "matplotlib": "all",
          "rl_zoo3": "zoo", "minatar": "minatar"}


def missing_dependency(exc: ModuleNotFoundError) -> ConfigError | None:
    """A ``ConfigError`` naming the extra to install for a missing optional package (None for others).

    Examples:
        >>> print(missing_dependency(ModuleNotFoundError("No module named 'envpool'", name="envpool")))
        envpool must be installed for this, got it missing. Fix: pip install "rlaccel-plugins[envpool]"
    """
    package = (exc.name or "").split(".")[0]
    if package not in EXTRAS:
        return None
    return ConfigError(f"{package} must be installed for this, got it missing. "
                       f'Fix: pip install "rlaccel-plugins[{EXTRAS[package]}]"')


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


def invalid(param: str, constraint: str, value: object, fix: str = "") -> ConfigError:
    """Build the project's standard error: ``<param> must <constraint>, got <param>=<value!r>. <fix>``."""
    message = f"{param} must {constraint}, got {param}={value!r}."
    return ConfigError(f"{message} {fix}".rstrip())
