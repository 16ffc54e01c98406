"""SB3 replay buffers backed by the core tiered engine: drop-in for `ReplayBuffer` / `DictReplayBuffer`.

Only the storage and the choice of rows change. SB3's contract is kept: ``sample`` /
``_get_samples``, VecNormalize (normalised at sample time with current statistics), timeouts
(``TimeLimit.truncated``), n-step returns (``n_steps`` / ``gamma``, the same computation as SB3's
``NStepReplayBuffer``), sampling with replacement, ``pos`` / ``full`` / ``buffer_size`` / ``dones``,
pickling for ``save_replay_buffer`` / ``load_replay_buffer``.

Inputs are taken as SB3 takes them: each value is assigned into a row of the stored shape and dtype,
so numpy decides (a ``(1, n)`` value broadcasts, a scalar reward fills every env, a float action
``1.0`` of a Discrete space is stored as ``1``). Two documented exceptions raise ``ConfigError``:
NaN/Inf, and non-integral floats for an integer field (SB3 would silently truncate ``0.7`` to ``0``).
Without an explicit ``seed`` the sampler's seed is derived from numpy's global RNG state (which SB3
seeds from the model's ``seed`` before it builds the buffer) without drawing from it, so a seeded
model gives a reproducible run and every other random draw of the run is unchanged.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.preprocessing import is_image_space
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from rlaccel_plugins.config import ReplayBufferConfig, checked_int
from rlaccel_plugins.errors import ConfigError, RlaccelWarning, invalid
from rlaccel_plugins.loader import resolve_replay_config
from rlaccel_plugins.replay import TieredReplay
from rlaccel_plugins.replay.evidence import resolve_sampling
from rlaccel_plugins.replay.sampler import seed_from_numpy_global_state


def algorithm_building(depth: int = 8) -> str | None:
    """The SB3 algorithm whose ``_setup_model`` is building a buffer (``dqn``, ``qrdqn``, ``sac``...), or None.

    SB3 builds the buffer from ``replay_buffer_class`` inside the algorithm's own constructor, which passes the
    buffer no word of which algorithm it serves; the caller's frame is the one place that says. A subclass
    counts as the SB3 or sb3-contrib class it derives from.
    """
    frame: Any = sys._getframe(1)
    for _ in range(depth):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and type(owner).__name__ != "type" and hasattr(owner, "_setup_model"):
            for cls in type(owner).__mro__:
                if cls.__module__.split(".")[0] in ("stable_baselines3", "sb3_contrib"):
                    return cls.__name__.lower()
    return None


def as_stored_row(name: str, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``value`` as SB3's buffer stores it: assigned into a row of ``shape`` and ``dtype``.

    Numpy's assignment decides, as in SB3 (broadcasting, unsafe casts); non-integral floats for an
    integer field are refused instead of truncated.

    Examples:
        >>> as_stored_row("action", np.array([[1.0], [0.0]]), (2, 1), np.dtype(np.int64)).tolist()
        [[1], [0]]
        >>> as_stored_row("reward", 1.5, (3,), np.dtype(np.float32)).tolist()
        [1.5, 1.5, 1.5]
    """
    if type(value) is np.ndarray and value.shape == shape:  # the common cases, cheaply
        if value.dtype is dtype or value.dtype == dtype:
            return value
        if not (dtype.kind in "iu" and value.dtype.kind == "f"):
            return value.astype(dtype)  # numpy's unsafe cast, as assignment does (e.g. bool dones -> float32)
    value = np.asarray(value)
    if dtype.kind in "iu" and value.dtype.kind == "f" and not (
            np.isfinite(value).all() and (value == np.round(value)).all()):
        raise ConfigError(f"{name} must hold whole numbers (it is stored as {dtype.name}), got {name}="
                          f"{value.ravel()[:8].tolist()}. SB3's own buffer would silently truncate them (0.7 -> 0); "
                          "rlaccel refuses. Round them, or pass integer values.")
    row = np.empty(shape, dtype)
    try:
        row[...] = value
    except (ValueError, TypeError):
        raise invalid(f"{name}.shape", f"fit the stored row {shape} (numpy assignment, as in SB3)", value.shape,
                      "Pass one entry per env.") from None
    return row


def _has_pixels(space: spaces.Space) -> bool:
    """Whether observations hold images, whose sampling is decided apart (the pixel study's row): SB3's images
    (uint8 frames, Atari-like) and MinAtar's (a boolean channel per object kind, 10x10xC)."""
    if isinstance(space, spaces.Dict):
        return any(_has_pixels(sub) for sub in space.spaces.values())
    boolean_frames = isinstance(space, spaces.Box) and space.dtype == np.bool_ and len(space.shape) == 3
    return boolean_frames or is_image_space(space, check_channels=False)


class TieredBufferMixin:
    """Everything the two SB3 buffer classes share; the storage is a :class:`TieredReplay`."""

    _engine: TieredReplay

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: Any = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, preset: str | None = None,
                 level_capacity: list[int] | None = None, sampling_ratio: list[float] | None = None,
                 ratio_schedule: str | None = None, anneal_steps: int | None = None,
                 importance_beta: float | None = None, n_steps: int = 1, gamma: float = 0.99,
                 seed: int | None = None, replay_config: ReplayBufferConfig | None = None,
                 sampling: str | None = None) -> None:
        if isinstance(observation_space, spaces.Dict) and not isinstance(self, DictReplayBuffer):
            raise ConfigError(f"observation_space must not be a Dict for {type(self).__name__}, got "
                              f"observation_space={observation_space}. Use replay_buffer_class=TieredDictReplayBuffer "
                              "(as SB3 uses its DictReplayBuffer for Dict observations).")
        if replay_config is not None:  # built by rlaccel: the caller's config, as it is
            replay = replay_config
        else:  # built by SB3 from replay_buffer_class: the ambient config (RLACCEL_PRESET, files)
            replay = resolve_replay_config(buffer_size, n_envs, preset, level_capacity=level_capacity,
                                           levels=len(level_capacity) if level_capacity is not None else None,
                                           sampling_ratio=sampling_ratio, ratio_schedule=ratio_schedule,
                                           anneal_steps=anneal_steps, importance_beta=importance_beta,
                                           sampling=sampling)
        replay = resolve_sampling(replay, "sb3", algorithm_building(), pixels=_has_pixels(observation_space))
        seed = seed_from_numpy_global_state() if seed is None else seed
        self._engine = TieredReplay.from_config(replay, num_envs=n_envs, seed=seed)
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device=device, n_envs=n_envs)
        self.buffer_size = self._engine.layout.total_rows  # rows, as in SB3 (each holds n_envs transitions)
        # our next_obs is always the true next observation, so SB3's memory optimisation is not needed;
        # the flag is accepted (and kept, SB3 reads it) but changes nothing here
        self.optimize_memory_usage = optimize_memory_usage
        self.handle_timeout_termination = handle_timeout_termination
        self.n_steps = int(checked_int("n_steps", n_steps, minimum=1))
        self.gamma = float(gamma)
        self._action_shape = (n_envs, self.action_dim)
        self._plain_box = isinstance(observation_space, spaces.Box)  # obs passes through as it is
        self._no_timeouts = np.zeros(n_envs, dtype=np.float32)
        self.last_weights: np.ndarray | None = None
        self.last_levels: np.ndarray | None = None
        action_dtype = ReplayBuffer._maybe_cast_dtype(action_space.dtype)
        specs = {**self._obs_specs(), "action": ((self.action_dim,), action_dtype), "reward": ((), np.float32),
                 "done": ((), np.float32), "timeout": ((), np.float32)}
        self._engine.allocate(specs)
        self.weights_applied_by: object = None  # set by the callback's ImportanceWeightHook
        self._warned_unweighted = False

    # ------------------------------------------------------------------ SB3's attributes, backed by the engine
    @property
    def pos(self) -> int:
        return self._engine.pos

    @pos.setter
    def pos(self, value: int) -> None:
        self._engine.pos = int(value)

    @property
    def full(self) -> bool:
        return self._engine.full

    @full.setter
    def full(self, value: bool) -> None:
        self._engine.full = bool(value)

    @property
    def actions(self) -> np.ndarray:
        return self._engine.storage.arrays["action"]

    @property
    def rewards(self) -> np.ndarray:
        return self._engine.storage.arrays["reward"]

    @property
    def dones(self) -> np.ndarray:
        return self._engine.storage.arrays["done"]

    @property
    def timeouts(self) -> np.ndarray:
        return self._engine.storage.arrays["timeout"]

    @property
    def engine(self) -> TieredReplay:
        """The core :class:`TieredReplay` (levels, statistics, state)."""
        return self._engine

    # ------------------------------------------------------------------ writing
    def add(self, obs, next_obs, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
            infos: list[dict[str, Any]]) -> None:
        if self._add_as_stored(obs, next_obs, action, reward, done, infos):
            return
        if self.handle_timeout_termination:
            timeout = np.array([info.get("TimeLimit.truncated", False) for info in infos], dtype=np.float32)
        else:
            timeout = self._no_timeouts
        action = np.asarray(action)
        if action.size != self.n_envs * self.action_dim:  # SB3 reshapes it to (n_envs, action_dim)
            raise invalid("action.shape", f"hold n_envs x action_dim = {self._action_shape} values", action.shape,
                          "Pass one action per env.")
        action = action.reshape(self._action_shape)
        if self._plain_box:
            fields = dict(obs=obs, next_obs=next_obs)
        else:
            fields = {**self._obs_fields(obs, "obs"), **self._obs_fields(next_obs, "next_obs")}
        fields.update(action=action, reward=reward, done=done, timeout=timeout)
        # as_stored_row gives each field its row's shape and dtype (SB3's assignment), so the engine need not
        # check the schema again; timeouts are made here from booleans, and a VecEnv's dones are booleans
        rows = self._engine.row_specs
        finite = ("timeout", "done") if getattr(done, "dtype", None) == np.bool_ else ("timeout",)
        self._engine.add_rows({name: as_stored_row(name, value, *rows[name]) for name, value in fields.items()},
                              finite)

    def _add_as_stored(self, obs, next_obs, action, reward, done, infos) -> bool:
        """The common case in one pass — what a VecEnv hands SB3's loop: arrays of exactly the stored
        rows' shapes and dtypes (actions of ``n_envs * action_dim`` values, boolean or stored-dtype dones),
        plain Box observations, no frame deduplication — written straight into the rows, with the same
        NaN/Inf refusal (a finite sum of a few values means each is finite; anything else goes to the
        general path, which checks value by value and raises). False (nothing written) elsewhere."""
        engine = self._engine
        if not self._plain_box or engine.frames is not None or len(infos) != self.n_envs:
            return False
        rows = engine.row_specs
        for name, value in (("obs", obs), ("next_obs", next_obs), ("reward", reward)):
            shape, dtype = rows[name]
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                return False
        action_shape, action_dtype = rows["action"]
        done_shape, done_dtype = rows["done"]
        if type(action) is not np.ndarray or action.size != self.n_envs * self.action_dim \
                or action.dtype != action_dtype or type(done) is not np.ndarray or done.shape != done_shape \
                or (done.dtype != np.bool_ and done.dtype != done_dtype):
            return False
        floats = [obs, next_obs, reward] if done.dtype == np.bool_ else [obs, next_obs, reward, done]
        for value in floats:
            if value.dtype.kind == "f" and not (math.isfinite(sum(value.ravel().tolist())) if value.size <= 64
                                                else bool(np.isfinite(value).all())):
                return False
        if self.handle_timeout_termination:
            timeout = np.array([info.get("TimeLimit.truncated", False) for info in infos], dtype=np.float32)
            if timeout.shape != rows["timeout"][0]:  # e.g. array-valued flags: numpy's broadcast decides
                return False
        else:
            timeout = self._no_timeouts
        engine.write_rows({"obs": obs, "next_obs": next_obs, "action": action.reshape(action_shape), "reward": reward,
                           "done": done, "timeout": timeout})
        return True

    def reset(self) -> None:
        """Forget every transition (SB3's ``reset``; stacked frames start fresh too)."""
        self._engine.reset()

    # ------------------------------------------------------------------ pickling (save_replay_buffer)
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["weights_applied_by"] = None  # a hook on this process's networks, re-installed by the callback
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("weights_applied_by", None)
        state.setdefault("_warned_unweighted", False)
        self.__dict__.update({sys.intern(k): v for k, v in state.items()})  # as pickle's own setstate

    # ------------------------------------------------------------------ reading
    def sample(self, batch_size: int, env: VecNormalize | None = None):
        """Tiered sample (stratified across levels, shuffled); weights and levels kept on the buffer."""
        where = self._engine.sample_indices(batch_size)
        self.last_weights, self.last_levels = where.weights, where.levels
        if where.weights is not None and self.weights_applied_by is None and not self._warned_unweighted:
            self._warned_unweighted = True
            warnings.warn("rlaccel: importance_beta is set on this buffer, but nothing applies the weights, so "
                          "the model trains unweighted. Pass rlaccel_sb3.AccelerateCallback to learn() "
                          "(it applies them to the TD loss), or drop importance_beta.", RlaccelWarning,
                          stacklevel=2)
        return self._get_samples(where.rows, env=env, env_indices=where.envs)

    def sample_steps(self, steps: int, batch_size: int, env: VecNormalize | None = None):
        """What ``steps`` calls of :meth:`sample` return, as one sample of ``steps * batch_size`` rows (the
        same draws in the same order, the rows gathered once) and each call's importance weights: how a
        fused ``train()`` draws all its batches at once."""
        wheres = [self._engine.sample_indices(batch_size) for _ in range(steps)]
        self.last_weights, self.last_levels = wheres[-1].weights, wheres[-1].levels
        rows = np.concatenate([w.rows for w in wheres])
        envs = np.concatenate([w.envs for w in wheres])
        return self._get_samples(rows, env=env, env_indices=envs), [w.weights for w in wheres]

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None,
                     env_indices: np.ndarray | None = None):
        if env_indices is None:
            env_indices = self._engine.sampler.rng.integers(0, self.n_envs, size=len(batch_inds))
        if self.n_steps > 1:
            return self._n_step_samples(batch_inds, env_indices, env)
        data = self._engine.gather(batch_inds, env_indices)
        dones = (data["done"] * (1 - data["timeout"])).reshape(-1, 1)
        rewards = self._normalize_reward(data["reward"].reshape(-1, 1), env)
        return self._samples(self._obs_from(data, "obs", env), data["action"],
                             self._obs_from(data, "next_obs", env), dones, rewards)

    def _n_step_samples(self, batch_inds: np.ndarray, env_indices: np.ndarray, env: VecNormalize | None):
        # SB3's NStepReplayBuffer computation on our storage, with the newest row treated as truncated
        # so that no n-step return runs past the data into older rows of the ring
        n, envs = self.n_steps, env_indices[:, None]
        indices = (batch_inds[:, None] + np.arange(n)) % self.buffer_size
        beyond_newest = self._engine.age_of(batch_inds)[:, None] - np.arange(n) < 0
        rewards_seq = self._normalize_reward(self.rewards[indices, envs], env)
        dones_seq = self.dones[indices, envs].astype(bool)
        timeouts_seq = self.timeouts[indices, envs].astype(bool)
        newest = (self._engine.age_of(indices) == 0) & ~dones_seq
        stop = dones_seq | timeouts_seq | newest | beyond_newest
        done_idx = np.where(stop.any(axis=1), stop.argmax(axis=1), n - 1)
        mask = np.arange(n)[None, :] <= done_idx[:, None]
        discounts = (self.gamma ** mask.sum(axis=1, keepdims=True)).astype(np.float32)
        returns = (rewards_seq * (self.gamma ** np.arange(n, dtype=np.float32))[None, :] * mask).sum(
            axis=1, keepdims=True).astype(np.float32)
        last = (batch_inds + done_idx) % self.buffer_size
        final = self._engine.gather(last, env_indices, self._names("next_obs") + ["done", "timeout"])
        dones = (final["done"] * (1.0 - final["timeout"])).reshape(-1, 1)
        first = self._engine.gather(batch_inds, env_indices, self._names("obs") + ["action"])
        return self._samples(self._obs_from(first, "obs", env), first["action"],
                             self._obs_from(final, "next_obs", env), dones, returns, discounts)

    def _samples(self, obs, actions, next_obs, dones, rewards, discounts=None):
        def torch(x):
            return self.to_torch(x, copy=False)  # freshly gathered arrays: no second copy needed

        tensor_obs = {k: torch(v) for k, v in obs.items()} if isinstance(obs, dict) else torch(obs)
        tensor_next = {k: torch(v) for k, v in next_obs.items()} if isinstance(next_obs, dict) else torch(next_obs)
        cls = DictReplayBufferSamples if isinstance(obs, dict) else ReplayBufferSamples
        return cls(tensor_obs, torch(actions), tensor_next, torch(dones.astype(np.float32, copy=False)),
                   torch(rewards.astype(np.float32, copy=False)), None if discounts is None else torch(discounts))

    # ------------------------------------------------------------------ observations (plain or dict)
    def _obs_specs(self) -> dict[str, tuple]:
        dtype = self.observation_space.dtype
        return {"obs": (self.obs_shape, dtype), "next_obs": (self.obs_shape, dtype)}

    def _obs_fields(self, obs, prefix: str) -> dict[str, np.ndarray]:
        if isinstance(self.observation_space, spaces.Discrete):
            obs = np.asarray(obs).reshape((self.n_envs, *self.obs_shape))
        return {prefix: obs}

    def _names(self, prefix: str) -> list[str]:
        return [prefix]

    def _obs_from(self, data: dict[str, np.ndarray], prefix: str, env: VecNormalize | None):
        return self._normalize_obs(data[prefix], env)


class TieredReplayBuffer(TieredBufferMixin, ReplayBuffer):
    """SB3 ``ReplayBuffer`` with tiered sampling and the core engine's storage (frames stored once).

    Args:
        buffer_size: as SB3 passes it (also ``observation_space``, ``action_space``, ``device``,
            ``n_envs``, ``handle_timeout_termination`` and ``optimize_memory_usage``, which is
            accepted and unneeded: next observations are always stored, de-duplicated for stacked frames).
        preset: rlaccel preset whose tiers to fit into ``buffer_size`` (e.g. ``"atari"``): its recent
            levels as they are, the long-term level takes the rest; ``buffer_size`` is never changed.
        level_capacity: the tiers' capacities; explicit, it sets the capacity; without it or a preset
            the default tier proportions are scaled to ``buffer_size``. ``sampling_ratio``,
            ``ratio_schedule``, ``anneal_steps`` and ``importance_beta`` are the other tier settings
            (configuration reference).
        sampling: how a batch is drawn: ``"uniform"``, ``"tiers"``, ``"ere"`` or ``"cer"``
            (default: the preset's, see the README's sampling section).
        n_steps: n-step returns as in SB3's ``NStepReplayBuffer`` (``n_steps=1``: off), with ``gamma``.
        seed: seed of the buffer's sampling RNG (default: derived from numpy's global RNG state,
            which SB3 seeds from the model's ``seed``, without drawing from it).
        replay_config: a ready ``ReplayBufferConfig`` used as it is (what ``rlaccel train`` and
            ``accelerate()`` pass); the ambient configuration and the tier arguments are then not read.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> from rlaccel_sb3 import TieredReplayBuffer
        >>> model = DQN("MlpPolicy", "CartPole-v1", buffer_size=50_000,
        ...             replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="classic_control"))
        >>> model.replay_buffer.engine.config.level_capacity
        (5000, 45000)
    """

    @property
    def observations(self) -> np.ndarray:
        return self._plain_obs("obs")

    @property
    def next_observations(self) -> np.ndarray:
        return self._plain_obs("next_obs")

    def _plain_obs(self, name: str) -> np.ndarray:
        if name not in self._engine.storage.arrays:
            raise AttributeError(f"{name} is stored as de-duplicated frames; read it with "
                                 "buffer.engine.gather(rows, envs) instead of as one array")
        return self._engine.storage.arrays[name]


class TieredDictReplayBuffer(TieredBufferMixin, DictReplayBuffer):
    """SB3 ``DictReplayBuffer`` (dict observations) with tiered sampling; same arguments as
    :class:`TieredReplayBuffer`. Each observation key is a field of its own (no frame de-duplication)."""

    @property
    def observations(self) -> dict[str, np.ndarray]:
        return {k: self._engine.storage.arrays[f"obs.{k}"] for k in self.obs_shape}

    @property
    def next_observations(self) -> dict[str, np.ndarray]:
        return {k: self._engine.storage.arrays[f"next_obs.{k}"] for k in self.obs_shape}

    def _obs_specs(self) -> dict[str, tuple]:
        specs = {}
        for prefix in ("obs", "next_obs"):
            for key, shape in self.obs_shape.items():
                specs[f"{prefix}.{key}"] = (shape, self.observation_space[key].dtype)
        return specs

    def _obs_fields(self, obs, prefix: str) -> dict[str, np.ndarray]:
        out = {}
        for key, shape in self.obs_shape.items():
            value = np.asarray(obs[key])
            if isinstance(self.observation_space[key], spaces.Discrete):
                value = value.reshape((self.n_envs, *shape))
            out[f"{prefix}.{key}"] = value
        return out

    def _names(self, prefix: str) -> list[str]:
        return [f"{prefix}.{k}" for k in self.obs_shape]

    def _obs_from(self, data: dict[str, np.ndarray], prefix: str, env: VecNormalize | None):
        return self._normalize_obs({k: data[f"{prefix}.{k}"] for k in self.obs_shape}, env)
