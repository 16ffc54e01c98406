"""Built-in presets and the registry class plugins add to (the plugin manager owns
the registry; :func:`rlaccel_plugins.loader.get_preset` reads it).

The named presets but ``atari`` sample their batches uniformly (``sampling: uniform``): the learning study
found no sampling scheme better than uniform on their tasks (or did not measure their tasks), so they keep
the tiers as storage levels (and their ratios, for ``sampling: tiers``) and learn as the frameworks do.
``atari`` samples as the evidence decides per family on images (``sampling: auto``: its tiers for SB3 DQN,
where the pixel study confirmed them; uniform for every other family).
Every update trains the whole network (``sparse_update_interval: 1``, the default): on images the pixel
study found the sparse/dense schedule to learn less per env step and no more per second.

==================  ============================================================================
``default``         :class:`AccelConfig` defaults: the article's values, sampling and schedule as the study decided
``atari``           the article's Atari Pong settings, tiers where confirmed, every update full (above)
``mujoco``          continuous control: ``batch_size`` 1024
``multi_agent``     ``level_capacity[0]`` x2
``sparse_reward``   ``sampling_ratio[0]`` 0.8, the other ratios rescaled to sum to 1
``classic_control`` small tiers and batches for CartPole-size tasks
``off``             no acceleration: one uniform level, every update full, one env
==================  ============================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlaccel_plugins.config import AccelConfig, ReplayBufferConfig
from rlaccel_plugins.errors import ConfigError, did_you_mean
from rlaccel_plugins.hookspecs import hookimpl

ARTICLE = ReplayBufferConfig()  # the article's tiers, the base of the presets derived from it
# The article's sparse/dense schedule (its Pong settings): the whole network every 100th update, the last three layers
# on the others. No preset carries it (docs: Learning study, "Images: MinAtar"); it is one setting away, e.g.
# ``load_config(preset="atari", **ARTICLE_SCHEDULE)``.
ARTICLE_SCHEDULE: dict[str, Any] = {"sparse_update_interval": 100, "dense_layers": [-3, -2, -1]}


def _sparse_reward_ratios(first: float = 0.8) -> list[float]:
    rest = ARTICLE.sampling_ratio[1:]
    return [first, *(r * (1.0 - first) / sum(rest) for r in rest)]


BUILTIN_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("the article's values; sampling per algorithm family, every update full (the learning study)", {}),
    # The article's Pong settings but its sparse/dense schedule: the pixel study measured the schedule to learn less
    # per env step and no more per second (P over time 0.30 [0.15, 0.48]), so every update is full (the config's
    # default), by the rule fixed before its runs (a preset keeps the schedule only where fresh seeds confirm a gain). Its tiers sample
    # where the same study confirmed them (SB3 DQN on images: P 0.88 [0.74, 0.98] on fresh seeds): `auto`.
    "atari": (("vision tasks: the article's Atari Pong settings; its tiers where the pixel study confirmed them, "
               "every update full"), {
        "replay_buffer": {"levels": 4, "level_capacity": [1000, 5000, 20000, 100000],
                          "sampling_ratio": [0.7, 0.2, 0.08, 0.02], "sampling": "auto"},
        "training": {"batch_size": 512, "learning_rate": 0.00025, "parallel_envs": 256, "sync_interval": 50},
    }),
    "mujoco": ("continuous control: batch_size 1024", {"replay_buffer": {"sampling": "uniform"},
                                                        "training": {"batch_size": 1024}}),
    "multi_agent": ("multi-agent: level_capacity[0] x2", {
        "replay_buffer": {"level_capacity": [2 * ARTICLE.level_capacity[0], *ARTICLE.level_capacity[1:]],
                          "sampling": "uniform"},
    }),
    "sparse_reward": ("sparse reward: sampling_ratio[0] 0.8, others rescaled", {
        "replay_buffer": {"sampling_ratio": _sparse_reward_ratios(), "sampling": "uniform"},
    }),
    # Tuned by measurement on CartPole-v1 DQN (2-core CPU, README "Results"): a gradient step costs
    # about the same at batch 64 or 256 there, so fewer, larger steps (16 samples per env step) win,
    # and 3-step returns cut the env steps needed (median 14k-37k -> 17k-23k over 5 seeds).
    # Sparse/dense is off (every update full): the last three layers of these MLPs are the whole
    # network, and the ablation (README "Which technique helps") measured no gain from it here.
    "classic_control": (("CartPole-size tasks: small tiers, 3-step returns, batch 256, 16 samples per env step; "
                         "sparse/dense off (nothing to save on small MLPs)"), {
        "replay_buffer": {"levels": 2, "level_capacity": [5000, 45000], "sampling_ratio": [0.3, 0.7], "n_step": 3,
                          "sampling": "uniform"},
        "training": {"batch_size": 256, "replay_ratio": 16, "sparse_update_interval": 1,
                     "learning_rate": 0.0023, "parallel_envs": "auto", "sync_interval": 10},
    }),
    "off": ("no acceleration: one uniform level, every update full, one env", {
        "replay_buffer": {"levels": 1, "level_capacity": [1_000_000], "sampling_ratio": [1.0]},
        "training": {"sparse_update_interval": 1, "parallel_envs": 1},
    }),
}


# The presets the learning study measured, by (task family, algorithm): what `rlaccel train` trains with where the
# user names no preset. Elsewhere it trains the drop-in on the framework's own recipe: a preset tuned on one family
# (CartPole's learning rate and batch) is not applied to another's tasks unmeasured.
MEASURED_PRESETS = {("classic_control", "dqn"): "classic_control"}


def measured_preset(family: str, algo: str) -> str | None:
    """The preset measured for ``algo`` on the tasks of ``family``, or None.

    Examples:
        >>> measured_preset("classic_control", "dqn"), measured_preset("minatar", "dqn")
        ('classic_control', None)
    """
    return MEASURED_PRESETS.get((family, algo.lower()))


class PresetRegistry:
    """Named presets: each a description and the values it sets on top of the defaults."""

    def __init__(self) -> None:
        self._presets: dict[str, tuple[str, dict[str, Any]]] = {}

    def add(self, name: str, values: Mapping[str, Any], description: str = "") -> None:
        """Register ``name``; the values are validated now, so a bad preset fails at start-up."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"preset name must be a short identifier, got name={name!r}. Use snake_case.")
        if name in self._presets:
            raise ConfigError(f"preset name must be new, got name={name!r}, which is already registered. "
                              "Pick another name for your preset.")
        AccelConfig().merged(values)
        self._presets[name] = (description, dict(values))

    def get(self, name: str) -> AccelConfig:
        if name not in self._presets:
            raise ConfigError(f"preset must be a known preset name, got preset={name!r}."
                              f"{did_you_mean(name, self._presets)} Known presets: {sorted(self._presets)}.")
        return AccelConfig(preset=name).merged(self._presets[name][1])

    def describe(self, name: str) -> str:
        self.get(name)
        return self._presets[name][0]

    def names(self) -> list[str]:
        return list(self._presets)


@hookimpl(tryfirst=True)  # built-ins first, so a plugin cannot silently replace them
def rlaccel_register_presets(registry: PresetRegistry) -> None:
    for name, (description, values) in BUILTIN_PRESETS.items():
        registry.add(name, values, description)
