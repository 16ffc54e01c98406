"""make_vec_env: backends, Atari preprocessing parity, episode ends."""

import numpy as np
import pytest

import rlaccel_plugins as rla
from rlaccel_plugins.parallel.atari import AtariOptions, is_atari

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.needs('envpool', 'gymnasium')
def test_auto_picks_envpool_when_it_supports_the_task_and_gymnasium_otherwise():
    from rlaccel_plugins.parallel.factory import choose_backend

    assert choose_backend("CartPole-v1", "auto") == "envpool"
    assert choose_backend("CartPole-v1", "auto", num_envs=64) == "envpool"
    assert choose_backend("CartPole-v1", "auto", num_envs=4) == "gymnasium"  # microsecond steps: in-process wins
    assert choose_backend("Pong-v5", "auto", num_envs=4) == "envpool"
    assert choose_backend("Taxi-v4", "auto") == "gymnasium"  # gymnasium has it, envpool does not
    assert choose_backend("CartPole-v1", "gymnasium") == "gymnasium"
    with pytest.raises(rla.ConfigError, match="env_id must be a task envpool supports"):
        choose_backend("Taxi-v4", "envpool")


@pytest.mark.needs('envpool', 'gymnasium')
@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_cartpole_episode_ends_are_reported_on_both_backends(backend):
    env = rla.make_vec_env("CartPole-v1", num_envs=2, backend=backend, seed=0)
    env.reset(seed=0)
    ends = 0
    for _ in range(300):
        obs, _reward, terminated, truncated, _info = env.step(np.zeros(2, dtype=np.int64))  # always left: falls fast
        ends += int((terminated | truncated).sum())
        assert obs.shape == (2, 4)
    assert ends >= 10
    env.close()


@pytest.mark.needs('envpool', 'gymnasium')
@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_the_seed_fixes_the_action_spaces_draws(backend):
    def draws(seed):
        env = rla.make_vec_env("CartPole-v1", num_envs=2, backend=backend, seed=seed)
        out = [np.asarray(env.action_space.sample()).tolist() for _ in range(20)]
        env.close()
        return out

    assert draws(3) == draws(3) != draws(4)


@pytest.mark.needs('envpool', 'gymnasium', 'ale_py', 'cv2')
def test_atari_preprocessing_is_the_same_on_both_backends():
    assert is_atari("Pong-v5") and not is_atari("CartPole-v1")
    options = AtariOptions(noop_max=0, episodic_life=True, reward_clip=True)
    pool = rla.make_vec_env("Pong-v5", num_envs=1, backend="envpool", seed=0, atari=options)
    gym_env = rla.make_vec_env("Pong-v5", num_envs=1, backend="gymnasium", seed=0, atari=options,
                               vectorization_mode="sync")
    a, _ = pool.reset(seed=0)
    b, _ = gym_env.reset(seed=0)
    assert a.shape == b.shape == (1, 4, 84, 84) and a.dtype == b.dtype == np.uint8
    for obs in (a[0], b[0]):  # a reset stack repeats the first frame on both
        assert all(np.array_equal(obs[0], obs[k]) for k in range(4))
    assert np.mean(a != b) < 0.01  # the emulators differ (see below); the preprocessing does not
    config = pool.spec.config
    assert config.episodic_life and config.reward_clip and config.frame_skip == 4 and config.stack_num == 4
    for _ in range(50):
        obs, reward, *_ = gym_env.step(np.zeros(1, dtype=np.int64))
        assert set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
        assert obs.shape == (1, 4, 84, 84)
    pool.close()
    gym_env.close()


def _pool_then_resize(last_two_frames):
    """The one preprocessing both backends must apply: max over the last two frames, area-resize to 84x84."""
    import cv2

    return cv2.resize(np.maximum(*last_two_frames), (84, 84), interpolation=cv2.INTER_AREA)


def _raw_and_processed(backend, seed):
    """Two envs of one backend, same seed: raw grey 210x160 frames (skip 1) and the rlaccel pipeline."""
    options = AtariOptions(noop_max=0)
    if backend == "envpool":
        import envpool

        raw_kwargs = {**options.envpool_kwargs(), "frame_skip": 1, "img_height": 210, "img_width": 160,
                      "stack_num": 1}
        raw = envpool.make_gymnasium("Pong-v5", num_envs=1, seed=seed, **raw_kwargs)
        processed = rla.make_vec_env("Pong-v5", num_envs=1, backend="envpool", seed=seed, atari=options)
        raw.reset()

        def raw_frame(action):
            return raw.step(np.array([action]))[0][0, 0]
    else:
        import gymnasium as gym

        env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, obs_type="grayscale")
        env.reset(seed=seed)
        processed = rla.make_vec_env("Pong-v5", num_envs=1, backend="gymnasium", seed=seed, atari=options,
                                     vectorization_mode="sync")

        def raw_frame(action):
            return env.step(action)[0]
    processed.reset(seed=seed)
    return raw_frame, processed


@pytest.mark.needs('envpool', 'gymnasium', 'ale_py', 'cv2')
@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_atari_preprocessing_is_bit_exact_to_one_reference_on_each_backend(backend):
    """Frame skip 4, max-pool of the last two frames, area resize, stack: bit-exact on each backend.

    Across backends the *emulators* differ (envpool bundles its own ALE build: 0.02% of raw grey pixels
    differ on Pong's first frame), so bit-exactness is checked against the same reference function of each
    backend's own raw frames, driven by the same seed and actions.
    """
    raw_frame, processed = _raw_and_processed(backend, seed=3)
    actions = np.random.default_rng(0).integers(6, size=150)
    history = []
    for action in actions:
        frames = [raw_frame(int(action)) for _ in range(4)]
        obs, _, terminated, truncated, _ = processed.step(np.array([action]))
        assert not (terminated[0] or truncated[0])
        history.append(_pool_then_resize(frames[-2:]))
        assert np.array_equal(obs[0, -1], history[-1])
        assert all(np.array_equal(obs[0, -k], history[-k]) for k in range(1, min(4, len(history)) + 1))
    processed.close()
