import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import rlaccel_plugins as rla
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.replay import TierLayout, stratified_counts
from tests.replay_helpers import StackedFrameStreams


def vector_transition(t: int, num_envs: int) -> dict:
    ids = t * num_envs + np.arange(num_envs)
    return dict(obs=np.stack([ids, -ids], axis=1).astype(np.float32), action=ids.astype(np.int64),
                reward=ids.astype(np.float32), next_obs=np.stack([ids + 0.5, -ids], axis=1).astype(np.float32),
                terminated=(ids % 7 == 0), truncated=np.zeros(num_envs, bool))


def filled_buffer(caps, ratios, num_envs=1, steps=None, **kw) -> rla.TieredReplay:
    buf = rla.TieredReplay(level_capacity=caps, sampling_ratio=ratios, num_envs=num_envs, seed=0, **kw)
    for t in range(steps if steps is not None else sum(caps) // num_envs):
        buf.add(**vector_transition(t, num_envs))
    return buf


# ------------------------------------------------------------------ layout and the split
def test_levels_are_age_ranges_of_one_ring():
    buf = filled_buffer([10, 20, 30], [0.5, 0.3, 0.2], steps=75)  # wrapped past capacity 60
    s = buf.sample(600)
    ages = buf.age_of(s.indices)
    assert (ages[s.levels == 0] < 10).all()
    assert ((ages[s.levels == 1] >= 10) & (ages[s.levels == 1] < 30)).all()
    assert ((ages[s.levels == 2] >= 30) & (ages[s.levels == 2] < 60)).all()
    # the newest transition (t=74) is at age 0; ids tell the age: t = 74 - age
    assert np.array_equal(s.data["action"], 74 - ages)


def test_batch_split_is_stratified_with_largest_remainder():
    assert stratified_counts(512, np.array([0.7, 0.2, 0.08, 0.02])).tolist() == [359, 102, 41, 10]
    assert stratified_counts(3, np.array([0.5, 0.5, 0.0])).tolist() == [2, 1, 0]
    buf = filled_buffer([1000, 5000, 20000, 100000], [0.7, 0.2, 0.08, 0.02], num_envs=8, steps=20)
    # only L0 (125 rows per env) holds data: the whole batch comes from it
    assert np.bincount(buf.sample(512).levels, minlength=4).tolist() == [512, 0, 0, 0]


def test_ratios_renormalise_over_filled_levels():
    buf = filled_buffer([100, 100, 100], [0.5, 0.3, 0.2], steps=150)  # L0 full, L1 half, L2 empty
    assert np.bincount(buf.sample(800).levels, minlength=3).tolist() == [500, 300, 0]
    assert buf.level_sizes == [100, 50, 0]


def test_sampling_distribution_over_a_million_draws():
    caps, ratios = [100, 500, 2000, 10000], [0.7, 0.2, 0.08, 0.02]
    buf = filled_buffer(caps, ratios, num_envs=4, steps=3150 + 37)  # 3150 rows: full and wrapped
    levels, ages, envs = [], [], []
    for _ in range(2000):
        s = buf.sample(500)
        levels.append(s.levels)
        ages.append(buf.age_of(s.indices // 4))
        envs.append(s.indices % 4)
    levels, ages, envs = map(np.concatenate, (levels, ages, envs))
    assert len(levels) == 1_000_000
    shares = np.bincount(levels, minlength=4) / len(levels)
    assert np.allclose(shares, ratios, atol=0.01)
    layout = TierLayout(caps, num_envs=4)
    for level in range(4):
        inside = ages[levels == level] - layout.level_start[level]
        counts = np.bincount(inside * 25 // layout.rows_per_level[level], minlength=25)  # 25 equal bins
        assert stats.chisquare(counts).pvalue > 1e-3, f"level {level} is not uniform: {counts}"
    assert stats.chisquare(np.bincount(envs, minlength=4)).pvalue > 1e-3


def test_levels_and_samples_are_counted_for_monitoring():
    buf = filled_buffer([10, 30], [0.6, 0.4], steps=20)
    buf.sample(10)
    buf.sample(10)
    assert buf.level_samples == [12, 8]
    assert buf.stats() == {"level_fill/L0": 1.0, "level_fill/L1": pytest.approx(1 / 3),
                           "level_samples/L0": 12, "level_samples/L1": 8}


def test_anneal_moves_ratios_toward_uniform():
    buf = filled_buffer([10, 90], [0.9, 0.1], steps=100, ratio_schedule="anneal", anneal_steps=200)
    assert buf.sampler.level_probabilities(buf.stored_rows, progress=0.0) == pytest.approx([0.9, 0.1])
    assert buf.sampler.level_probabilities(buf.stored_rows, progress=0.5) == pytest.approx([0.5, 0.5])
    assert buf.sampler.level_probabilities(buf.stored_rows, progress=1.0) == pytest.approx([0.1, 0.9])
    # 100 transitions of 200 added: halfway
    assert np.bincount(buf.sample(1000).levels).tolist() == [500, 500]


def test_importance_weights_follow_n_p_beta_over_max():
    buf = filled_buffer([10, 90], [0.5, 0.5], steps=100, importance_beta=1.0)
    s = buf.sample(100)
    # P(L0 item) = 0.5/10, P(L1 item) = 0.5/90; N = 100; w = 1/(N*P) -> L0: 0.2, L1: 1.8; / max
    expected = np.where(s.levels == 0, 0.2 / 1.8, 1.0)
    assert np.allclose(s.weights, expected)
    assert filled_buffer([10, 90], [0.5, 0.5], steps=100).sample(4).weights is None


def test_batch_larger_than_buffer_is_drawn_with_replacement():
    buf = filled_buffer([4, 4], [0.5, 0.5], steps=3)
    s = buf.sample(64)
    assert len(s.indices) == 64 and set(s.data["action"].tolist()) <= {0, 1, 2}


# ------------------------------------------------------------------ multi-env and frames
def test_multi_env_capacities_count_transitions():
    buf = rla.TieredReplay.from_config(rla.get_preset("atari"), num_envs=8)
    assert buf.capacity == 126_000
    assert buf.layout.rows_per_level.tolist() == [125, 625, 2500, 12500]


def test_frame_dedup_rebuilds_stacks_bit_exactly_and_saves_memory():
    # Pong-like episodes (~1000 agent steps); stacks at resets cost 4 frames each
    streams = StackedFrameStreams(num_envs=3, stack=4, frame_shape=(84, 84), mean_episode=1000, seed=1)
    buf = rla.TieredReplay(level_capacity=[900, 2700], sampling_ratio=[0.5, 0.5], num_envs=3, seed=0)
    history = [streams.step() for _ in range(1500)]  # wraps: 1200 rows
    for tr in history:
        buf.add(**tr)
    assert buf.frames is not None
    rows = np.repeat(np.arange(1200), 3)
    envs = np.tile(np.arange(3), 1200)
    got = buf.gather(rows, envs)
    ages = buf.age_of(rows)
    for name in ("obs", "next_obs", "action", "terminated"):
        expected = np.stack([history[-1 - a][name][e] for a, e in zip(ages, envs)])
        assert np.array_equal(got[name], expected), name
    bytes_per_transition = buf.nbytes / buf.capacity
    assert bytes_per_transition < 7_500  # SB3: 28,224 (optimize_memory_usage) or 56,448


def test_frame_pool_grows_when_every_step_ends_an_episode():
    streams = StackedFrameStreams(num_envs=2, stack=3, frame_shape=(2, 2), mean_episode=1, seed=3)
    buf = rla.TieredReplay(level_capacity=[10, 10], sampling_ratio=[0.5, 0.5], num_envs=2, dedup_frames=True)
    history = [streams.step() for _ in range(40)]
    for tr in history:
        buf.add(**tr)
    got = buf.gather(np.repeat(np.arange(10), 2), np.tile(np.arange(2), 10))
    ages = buf.age_of(np.repeat(np.arange(10), 2))
    expected = np.stack([history[-1 - a]["obs"][e] for a, e in zip(ages, np.tile(np.arange(2), 10))])
    assert np.array_equal(got["obs"], expected)


# ------------------------------------------------------------------ state
def test_state_dict_round_trip_is_bit_exact_including_rng():
    streams = StackedFrameStreams(num_envs=2, stack=4, frame_shape=(8, 8), mean_episode=10, seed=2)
    a = rla.TieredReplay(level_capacity=[20, 60], sampling_ratio=[0.7, 0.3], num_envs=2, seed=5)
    for _ in range(70):
        a.add(**streams.step())
    a.sample(16)
    state = pickle.loads(pickle.dumps(a.state_dict()))
    b = rla.TieredReplay(level_capacity=[20, 60], sampling_ratio=[0.7, 0.3], num_envs=2, seed=99)
    b.load_state_dict(state)
    tail = [streams.step() for _ in range(15)]
    for buf in (a, b):
        for tr in tail:
            buf.add(**tr)
    sa, sb = a.sample(64), b.sample(64)
    assert np.array_equal(sa.indices, sb.indices)
    for name in sa.data:
        assert np.array_equal(sa.data[name], sb.data[name])
    assert a.level_samples == b.level_samples and len(a) == len(b)


def test_load_state_dict_refuses_another_layout():
    a = filled_buffer([10, 10], [0.5, 0.5], steps=5)
    b = rla.TieredReplay(level_capacity=[10, 20], sampling_ratio=[0.5, 0.5])
    with pytest.raises(ValueError, match="same layout"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="state_dict of version"):
        b.load_state_dict({"nope": 1})


# ------------------------------------------------------------------ bad input
def test_bad_input_gets_clear_errors():
    with pytest.raises(ConfigError, match="sampling_ratio must sum to 1, got sampling_ratio=\\[0.7, 0.2\\]"):
        rla.TieredReplay(level_capacity=[10, 10], sampling_ratio=[0.7, 0.2])
    with pytest.raises(ConfigError, match="at least one row per env"):
        rla.TieredReplay(level_capacity=[2, 100], sampling_ratio=[0.5, 0.5], num_envs=4)
    with pytest.raises(ConfigError, match="level_capacity must be a list of positive integers"):
        rla.TieredReplay(level_capacity=[10, -1], sampling_ratio=[0.5, 0.5])
    with pytest.raises(ConfigError, match="num_envs must be a positive integer"):
        rla.TieredReplay(level_capacity=[10], sampling_ratio=[1.0], num_envs=0)
    buf = rla.TieredReplay(level_capacity=[10], sampling_ratio=[1.0], num_envs=2)
    with pytest.raises(ValueError, match="empty buffer"):
        buf.sample(4)
    with pytest.raises(ConfigError, match=r"obs.shape must start with num_envs=2, got obs.shape=\(3,\)"):
        buf.add(obs=np.zeros(3))
    buf.add(obs=np.zeros((2, 3), np.float32), reward=np.zeros(2, np.float32))
    with pytest.raises(ConfigError, match=r"obs.shape must be \(2, 3\)"):
        buf.add(obs=np.zeros((2, 4), np.float32), reward=np.zeros(2, np.float32))
    with pytest.raises(ConfigError, match="fields must match the first add"):
        buf.add(obs=np.zeros((2, 3), np.float32))
    with pytest.raises(ConfigError, match="reward.dtype must be castable to float32"):
        buf.add(obs=np.zeros((2, 3), np.float32), reward=np.array(["a", "b"]))
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        buf.sample(0)
    buf.add(obs=np.zeros((2, 3)), reward=np.zeros(2))  # float64 -> float32 is the same kind: stored
    assert len(buf) == 4
    with pytest.raises(ConfigError, match="dedup_frames=True needs"):
        rla.TieredReplay(level_capacity=[10], sampling_ratio=[1.0], dedup_frames=True).add(obs=np.zeros((1, 3)))


# ------------------------------------------------------------------ against a reference model
class ReferenceReplay:
    """The obvious implementation: one list per env stream, newest last, capped at its capacity."""

    def __init__(self, rows: int, num_envs: int) -> None:
        self.rows, self.streams = rows, [[] for _ in range(num_envs)]

    def add(self, transition: dict) -> None:
        for e, stream in enumerate(self.streams):
            stream.append({k: np.asarray(v)[e] for k, v in transition.items()})
            del stream[:-self.rows]

    def at_age(self, age: int, env: int) -> dict:
        return self.streams[env][-1 - age]


@settings(max_examples=60, deadline=None)
@given(num_envs=st.integers(1, 3), caps=st.lists(st.integers(3, 12), min_size=1, max_size=3),
       steps=st.integers(1, 60), stack=st.integers(1, 3), mean_episode=st.sampled_from([1, 3, 10]),
       pixels=st.booleans(), seed=st.integers(0, 1000))
def test_engine_matches_reference_model(num_envs, caps, steps, stack, mean_episode, pixels, seed):
    caps = [max(c, num_envs) for c in caps]
    ratios = np.full(len(caps), 1.0 / len(caps)).tolist()
    buf = rla.TieredReplay(level_capacity=caps, sampling_ratio=ratios, num_envs=num_envs, seed=seed)
    ref = ReferenceReplay(buf.layout.total_rows, num_envs)
    streams = StackedFrameStreams(num_envs, stack=stack, frame_shape=(2, 3), mean_episode=mean_episode, seed=seed)
    for t in range(steps):
        tr = streams.step() if pixels else vector_transition(t, num_envs)
        buf.add(**tr)
        ref.add(tr)
        if t % 7 == 0 or t == steps - 1:
            s = buf.sample(17)
            rows, envs = s.indices // num_envs, s.indices % num_envs
            ages = buf.age_of(rows)
            assert (ages < len(ref.streams[0])).all()
            assert np.array_equal(buf.layout.level_of_age(ages), s.levels)
            for i, (age, env) in enumerate(zip(ages, envs)):
                expected = ref.at_age(int(age), int(env))
                for name, value in expected.items():
                    assert np.array_equal(s.data[name][i], value), (name, t, age, env)
    assert len(buf) == len(ref.streams[0]) * num_envs
    assert (buf.frames is not None) == pixels  # uint8 stacks (k, H, W) are de-duplicated, nothing else


def test_reset_forgets_everything_and_the_buffer_refills_bit_exactly():
    rng = np.random.default_rng(0)
    buf = rla.TieredReplay(level_capacity=[4, 8], sampling_ratio=[0.5, 0.5], num_envs=2, seed=0)
    stacks = rng.integers(0, 255, size=(12, 2, 4, 6, 6), dtype=np.uint8)

    def add(t):
        buf.add(obs=stacks[t], next_obs=stacks[t + 1], action=np.zeros(2, np.int64), reward=np.ones(2, np.float32))

    for t in range(5):
        add(t)
    assert buf.frames is not None and len(buf) == 10
    buf.reset()
    assert len(buf) == 0 and buf.level_sizes == [0, 0]
    with pytest.raises(ValueError, match="empty buffer"):
        buf.sample(4)
    for t in range(5, 11):  # continues the old stream: the frames must still be rebuilt exactly
        add(t)
    assert len(buf) == 12
    data = buf.gather(np.arange(6), np.zeros(6, np.int64))
    assert np.array_equal(data["obs"], stacks[5:11, 0]) and np.array_equal(data["next_obs"], stacks[6:12, 0])


@pytest.mark.parametrize("pixels", [True, False])
def test_a_pickled_buffer_holds_what_is_stored_and_loads_back_exactly(pixels):
    buf = rla.TieredReplay(level_capacity=[2000, 18000], sampling_ratio=[0.5, 0.5], num_envs=2, seed=0)
    streams = StackedFrameStreams(2, stack=4, frame_shape=(84, 84), seed=1)
    for t in range(150):
        buf.add(**(streams.step() if pixels else vector_transition(t, 2)))
    per_row = 2 * 84 * 84 if pixels else 2 * 4 * (4 + 4 + 1 + 1 + 1 + 1)  # one new frame per env per step
    blob = pickle.dumps(buf, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(blob) < 3 * 150 * per_row + 100_000  # ~what is stored, not the 20,000-transition ring
    back = pickle.loads(blob)
    assert back.nbytes == buf.nbytes and len(back) == len(buf) == 300
    for name, array in buf.storage.arrays.items():
        assert np.array_equal(back.storage.arrays[name], array), name
    if pixels:
        assert np.array_equal(back.frames.frames, buf.frames.frames)
    a, b = buf.sample(64), back.sample(64)  # the sampler's RNG travels too
    assert all(np.array_equal(a.data[k], b.data[k]) for k in a.data)
    for t in range(150, 200):  # and it goes on storing, bit-exactly
        tr = streams.step() if pixels else vector_transition(t, 2)
        buf.add(**tr)
        back.add(**tr)
    a, b = buf.sample(64), back.sample(64)
    assert all(np.array_equal(a.data[k], b.data[k]) for k in a.data)
