"""``rollout_batches``: SB3's ``RolloutBuffer.get`` for the fused PPO/A2C ``train()`` — the same batches of
the same values (dtypes and shapes included) from the same permutation draw, fewer copies."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlaccel_sb3.rollout_batches import rollout_batches
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer

from rlaccel_plugins.fused import differences

SPACES = {
    "box, discrete": (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(3)),
    "float64 box, box": (gym.spaces.Box(-1, 1, (2,), dtype=np.float64), gym.spaces.Box(-2, 2, (2,))),
    "frames, multi-discrete": (gym.spaces.Box(0, 255, (2, 6, 6), np.uint8), gym.spaces.MultiDiscrete([3, 2])),
}


def _filled(cls, observation_space, action_space, n_steps: int, n_envs: int, seed: int = 0):
    buffer = cls(n_steps, observation_space, action_space, n_envs=n_envs)
    observation_space.seed(seed)
    action_space.seed(seed)
    rng = np.random.default_rng(seed)
    for _ in range(n_steps):
        obs = np.stack([observation_space.sample() for _ in range(n_envs)])
        if isinstance(obs[0], dict):
            obs = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
        actions = np.stack([action_space.sample() for _ in range(n_envs)])
        buffer.add(obs, actions, rng.standard_normal(n_envs).astype(np.float32), rng.random(n_envs) < 0.1,
                   torch.as_tensor(rng.standard_normal(n_envs)), torch.as_tensor(rng.standard_normal(n_envs)))
    buffer.compute_returns_and_advantage(torch.as_tensor(rng.standard_normal(n_envs)), np.zeros(n_envs, bool))
    return buffer


def _batches_and_rng(get, buffer, batch_size):
    np.random.seed(5)
    batches = [tuple(batch) for batch in get(buffer, batch_size)]
    return batches, np.random.rand()


@pytest.mark.parametrize("spaces", SPACES.values(), ids=SPACES.keys())
@pytest.mark.parametrize(("n_envs", "batch_size"), [(1, None), (4, None), (4, 8), (3, 7)])
def test_the_batches_are_sb3s_own_field_for_field_and_draw_the_same_permutation(spaces, n_envs, batch_size):
    stock = _batches_and_rng(RolloutBuffer.get, _filled(RolloutBuffer, *spaces, 12, n_envs), batch_size)
    lean = _batches_and_rng(rollout_batches, _filled(RolloutBuffer, *spaces, 12, n_envs), batch_size)
    assert len(stock[0]) == -(-12 * n_envs // (batch_size or 12 * n_envs))
    assert differences(stock, lean) == []
    for ours, theirs in zip(lean[0], stock[0]):
        assert [(t.dtype, t.shape, t.is_contiguous()) for t in ours] == [(t.dtype, t.shape, True) for t in theirs]


def test_a_second_pass_over_the_same_rollout_gets_the_same_batches_as_sb3s_second_pass():
    # PPO's epochs: get() again on the already swapped and flattened arrays
    stock, lean = _filled(RolloutBuffer, *SPACES["box, discrete"], 10, 4), _filled(RolloutBuffer, *SPACES["box, discrete"], 10, 4)
    for _ in range(3):
        assert differences(_batches_and_rng(RolloutBuffer.get, stock, 16), _batches_and_rng(rollout_batches, lean, 16)) == []


def test_other_buffer_classes_get_their_own_get():
    class Mine(RolloutBuffer):
        def get(self, batch_size=None):
            yield "mine"

    spaces = SPACES["box, discrete"]
    assert list(rollout_batches(_filled(Mine, *spaces, 4, 2), 4)) == ["mine"]
    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,))})
    stock = _batches_and_rng(DictRolloutBuffer.get, _filled(DictRolloutBuffer, observation_space, spaces[1], 6, 2), 4)
    lean = _batches_and_rng(rollout_batches, _filled(DictRolloutBuffer, observation_space, spaces[1], 6, 2), 4)
    assert differences(stock, lean) == []
