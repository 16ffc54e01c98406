"""The SB3 env builder of `rlaccel train`, its Ray actors and tests: one place for both backends."""

from __future__ import annotations

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecMonitor

from rlaccel_plugins.parallel.factory import choose_backend
from rlaccel_plugins.tasks import ensure_registered, task_info
from rlaccel_sb3.envpool_vec_env import EnvPoolVecEnv


def make_env(env_id: str, n_envs: int, seed: int, accelerated: bool, evaluation: bool = False):
    """The training (or evaluation) VecEnv: envpool for rlaccel where it can, SB3's own otherwise.

    Atari follows RL Zoo: SB3's ``AtariWrapper`` + 4-frame stack on ``<Game>NoFrameskip-v4`` for stock,
    envpool with the same preprocessing for rlaccel; evaluation envs score whole games, unclipped.
    """
    ensure_registered(env_id)
    if task_info(env_id).atari:
        if accelerated:
            options = dict(episodic_life=False, reward_clip=False) if evaluation else {}
            return VecMonitor(EnvPoolVecEnv(env_id, num_envs=n_envs, seed=seed, sb3_atari=True, **options))
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack

        game = env_id.split("-")[0]
        wrapper = dict(terminal_on_life_loss=False, clip_reward=False) if evaluation else None
        return VecFrameStack(make_atari_env(f"{game}NoFrameskip-v4", n_envs=n_envs, seed=seed,
                                            wrapper_kwargs=wrapper), 4)
    if choose_backend(env_id, "auto" if accelerated else "gymnasium", n_envs) == "envpool":
        return VecMonitor(EnvPoolVecEnv(env_id, num_envs=n_envs, seed=seed))
    return make_vec_env(env_id, n_envs=n_envs, seed=seed)
