"""One Atari preprocessing, two backends: envpool's built-in pipeline or gymnasium's wrappers.

Both give ``(stack, 84, 84)`` uint8 observations from frame skip with max-pooling, grey 84x84
(area resize), no-op starts, optional episodic life and reward clipping, so results compare across
backends. The preprocessing is bit-exact on both (tested against one reference function of each
backend's raw frames); the emulators are not: envpool bundles its own ALE build, and 0.02% of Pong's
raw grey pixels differ from ale-py's on the first frame (0.06% after preprocessing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlaccel_plugins.tasks import is_atari, register_ale

__all__ = ["AtariOptions", "is_atari", "register_ale"]


@dataclass(frozen=True)
class AtariOptions:
    """Preprocessing settings shared by both backends (DQN-paper defaults, sticky actions off)."""

    frame_skip: int = 4
    noop_max: int = 30
    screen_size: int = 84
    stack: int = 4
    episodic_life: bool = False
    reward_clip: bool = False
    repeat_action_probability: float = 0.0
    max_episode_frames: int = 108_000

    def envpool_kwargs(self) -> dict[str, Any]:
        return dict(frame_skip=self.frame_skip,
                    noop_max=max(1, self.noop_max),  # envpool 1.2.5 segfaults on reset with noop_max=0
                    img_height=self.screen_size, img_width=self.screen_size, stack_num=self.stack, gray_scale=True,
                    episodic_life=self.episodic_life, reward_clip=self.reward_clip,
                    repeat_action_probability=self.repeat_action_probability, use_fire_reset=False,
                    use_inter_area_resize=True, max_episode_steps=self.max_episode_frames // self.frame_skip)

    def gymnasium_env(self, env_id: str):
        """One preprocessed gymnasium env for an envpool-style id (``"Pong-v5"``)."""
        import gymnasium as gym
        import numpy as np
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TransformReward

        register_ale()
        env = gym.make(f"ALE/{env_id}", frameskip=1, repeat_action_probability=self.repeat_action_probability,
                       max_num_frames_per_episode=self.max_episode_frames)
        env = AtariPreprocessing(env, noop_max=self.noop_max, frame_skip=self.frame_skip,
                                 screen_size=self.screen_size, terminal_on_life_loss=self.episodic_life,
                                 grayscale_obs=True)
        if self.reward_clip:
            env = TransformReward(env, lambda r: float(np.sign(float(r))))
        return FrameStackObservation(env, self.stack)


