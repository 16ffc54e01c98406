"""The pixel study's drop-in is SB3 on its recipe: MinAtar's network on 10x10xC boolean frames, centred RMSprop.

Stock SB3 and the drop-in sampling uniformly (``preset="off"``) collect the same transitions and store them
alike (every field, and the batch gathered for the same indices), and the fused ``train()`` is SB3's own for
200 gradient steps of this convolutional network, bit for bit. What remains different between the study's two
variants is which batches are drawn (the drop-in's own seeded generator).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences
from tests.equivalence.test_sb3_fused import _run

pytestmark = pytest.mark.needs("minatar")

GAME = "MinAtar/SpaceInvaders-v1"  # six object channels; episodes end within the fill


def _model(dropin: bool, steps: int):
    """A model on the study's recipe whose buffer holds ``steps`` transitions and which has not trained yet."""
    from rlaccel_sb3 import AccelerateCallback, TieredReplayBuffer
    from rlaccel_sb3.envs import make_env
    from rlaccel_sb3.train import zoo_settings
    from stable_baselines3 import DQN

    kwargs = zoo_settings("dqn", GAME)
    kwargs.pop("n_timesteps")
    kwargs.update(learning_starts=10_000, buffer_size=2_000)
    if dropin:
        kwargs.update(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="off"))
    model = DQN("MlpPolicy", make_env(GAME, 1, 0, accelerated=False), seed=3, **kwargs)
    model.learn(steps, callback=AccelerateCallback(preset="off") if dropin else None)
    return model


def test_the_drop_in_collects_and_stores_what_stock_sb3_does_on_minatar():
    stock, dropin = _model(False, 800), _model(True, 800)
    assert type(dropin.replay_buffer).__name__ == "TieredReplayBuffer"
    rows = stock.replay_buffer.pos
    assert rows == dropin.replay_buffer.pos == 800 and stock.replay_buffer.dones[:rows].sum() > 0
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        ours, theirs = getattr(dropin.replay_buffer, name)[:rows], getattr(stock.replay_buffer, name)[:rows]
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), name
    indices = np.arange(0, rows, 3)
    ours, theirs = dropin.replay_buffer._get_samples(indices), stock.replay_buffer._get_samples(indices)
    for field in ("observations", "actions", "next_observations", "dones", "rewards"):
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field


def test_the_fused_train_is_sb3s_on_minatars_network_with_centred_rmsprop_bit_for_bit():
    from rlaccel_sb3.fused import fused_train_for

    stock, fused = _model(False, 600), _model(False, 600)
    assert isinstance(stock.policy.optimizer, torch.optim.RMSprop) and stock.policy.optimizer.defaults["centered"]
    assert not differences(dict(stock.policy.state_dict()), dict(fused.policy.state_dict()))
    ran_stock, ran_fused = _run(stock, stock.train), _run(fused, fused_train_for(fused))
    assert len(ran_stock["gradients"]) == len(ran_fused["gradients"]) == 200
    assert differences(ran_stock, ran_fused) == []
