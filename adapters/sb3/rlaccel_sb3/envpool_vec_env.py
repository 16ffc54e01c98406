"""`EnvPoolVecEnv`: an SB3 ``VecEnv`` over envpool, with SB3's episode-end semantics.

envpool resets a finished env on the *next* ``step`` (that step's action is dropped and it returns
reward 0). SB3 expects what its ``DummyVecEnv`` does: the step that ends an episode returns the
reset observation, with the last one in ``info["terminal_observation"]`` and
``info["TimeLimit.truncated"]`` set on time-limit ends. This adapter does exactly that with an
explicit partial reset of the finished envs, so no bogus transition reaches a replay buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

# SB3's AtariWrapper + the RL Zoo's frame_stack 4, in envpool's terms
SB3_ATARI_OPTIONS = dict(episodic_life=True, reward_clip=True, noop_max=30, frame_skip=4, stack_num=4,
                         img_height=84, img_width=84, gray_scale=True, repeat_action_probability=0.0,
                         use_fire_reset=True)
_DROPPED_INFO = ("players", "ram", "env_id")  # bulky or internal; env_id is used for ordering


class EnvPoolVecEnv(VecEnv):
    """SB3 ``VecEnv`` running ``num_envs`` copies of ``env_id`` in envpool (synchronous mode).

    Args:
        env_id: an envpool task id (``"CartPole-v1"``, ``"Pong-v5"``, ``"HalfCheetah-v5"``, …).
        num_envs: parallel envs.
        seed: envpool seed (env ``i`` gets ``seed + i``); :meth:`seed` rebuilds the pool.
        sb3_atari: apply SB3's ``AtariWrapper`` settings (episodic life, reward clipping, no-op
            starts, frame skip 4, 84x84 grey, stack 4) so results compare with SB3's Atari pipeline.
        **envpool_kwargs: passed to ``envpool.make_gymnasium`` (they win over ``sb3_atari``).

    Float64 observation spaces (MuJoCo) are served as float32, as SB3's policies compute in float32.

    Examples:
        >>> from rlaccel_sb3 import EnvPoolVecEnv
        >>> venv = EnvPoolVecEnv("CartPole-v1", num_envs=4, seed=0)
        >>> venv.reset().shape
        (4, 4)
        >>> venv.close()
    """

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, *, sb3_atari: bool = False,
                 **envpool_kwargs: Any) -> None:
        import envpool

        if env_id not in envpool.list_all_envs():
            from rlaccel_plugins.errors import ConfigError, did_you_mean

            raise ConfigError(f"env_id must be an envpool task, got env_id={env_id!r}."
                              f"{did_you_mean(env_id, envpool.list_all_envs())} Use SB3's make_vec_env otherwise.")
        self.env_id = env_id
        from rlaccel_plugins.parallel.factory import envpool_threads

        self._kwargs = {"num_threads": envpool_threads(env_id, num_envs), **(SB3_ATARI_OPTIONS if sb3_atari else {}),
                        **envpool_kwargs}
        self._seed = seed
        self.pool = self._make_pool(num_envs)
        observation_space = self.pool.observation_space
        self._cast_obs = isinstance(observation_space, spaces.Box) and observation_space.dtype == np.float64
        if self._cast_obs:
            observation_space = spaces.Box(observation_space.low.astype(np.float32),
                                           observation_space.high.astype(np.float32), dtype=np.float32)
        super().__init__(num_envs, observation_space, self.pool.action_space)
        self._actions: np.ndarray | None = None
        self._needs_rebuild = False

    def _make_pool(self, num_envs: int):
        """The envpool, through ``make_vec_env`` (so a plugin's ``rlaccel_make_env`` answers first; it
        must return an envpool-API env for ``backend="envpool"``), with exactly these kwargs."""
        from rlaccel_plugins.parallel.factory import make_vec_env

        return make_vec_env(self.env_id, num_envs=num_envs, backend="envpool", seed=self._seed, atari=False,
                            **self._kwargs)

    # ------------------------------------------------------------------ VecEnv API
    def reset(self) -> np.ndarray:
        if self._needs_rebuild:
            self.pool.close()
            self.pool = self._make_pool(self.num_envs)
            self._needs_rebuild = False
        obs, info = self.pool.reset()
        order = np.argsort(info["env_id"])
        self.reset_infos = self._split_infos({k: v for k, v in info.items()}, order)
        return self._obs(obs[order])

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self):
        obs, rewards, terminated, truncated, info = self.pool.step(self._actions)
        order = np.argsort(info["env_id"])
        obs, rewards = self._obs(obs[order]), rewards[order].astype(np.float32)
        terminated, truncated = terminated[order], truncated[order]
        dones = terminated | truncated
        infos = self._split_infos(info, order)
        finished = np.flatnonzero(dones)
        for i in finished:
            infos[i]["terminal_observation"] = obs[i].copy()
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        if len(finished):
            reset_obs, reset_info = self.pool.reset(finished)
            obs[reset_info["env_id"]] = self._obs(reset_obs)
        return obs, rewards, dones, infos

    def close(self) -> None:
        self.pool.close()

    def seed(self, seed: int | None = None) -> list[int | None]:
        """Rebuild the pool with ``seed`` at the next :meth:`reset` (envpool seeds only at creation)."""
        if seed is not None:
            self._seed, self._needs_rebuild = int(seed), True
        return [self._seed + i for i in range(self.num_envs)]

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        if attr_name == "render_mode":  # envpool has no rendering
            value = None
        else:
            value = self.env_id if attr_name == "env_id" else getattr(self.pool, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        raise NotImplementedError(f"envpool envs have no settable attribute {attr_name!r}: pass it to "
                                  "EnvPoolVecEnv(...) as an envpool option instead.")

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        raise NotImplementedError(f"envpool envs are not Python objects; {method_name}() cannot be called on them. "
                                  "Use SB3's DummyVecEnv for envs that need per-env methods.")

    def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self):
        raise NotImplementedError("EnvPoolVecEnv does not render; use a gymnasium env with render_mode='rgb_array'.")

    # ------------------------------------------------------------------ helpers
    def _obs(self, obs: np.ndarray) -> np.ndarray:
        return obs.astype(np.float32) if self._cast_obs else obs

    def _split_infos(self, info: dict[str, Any], order: np.ndarray) -> list[dict[str, Any]]:
        keys = [k for k, v in info.items() if k not in _DROPPED_INFO and isinstance(v, np.ndarray)]
        return [{k: info[k][j] for k in keys} for j in order]
