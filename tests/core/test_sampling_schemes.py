"""The sampling schemes (``replay_buffer.sampling``): each scheme's distribution, checked by counting."""

import numpy as np
import pytest
from scipy import stats

import rlaccel_plugins as rla
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.replay import CerSampler, EreSampler, TierLayout, UniformSampler, make_sampler
from tests.core.test_replay import vector_transition


def uniform_over(values: np.ndarray, size: int) -> bool:
    """Whether ``values`` (in ``range(size)``) look uniform to a chi-square test over equal bins."""
    bins = 20 if size % 20 == 0 else size
    counts = np.bincount(values * bins // size, minlength=bins)
    return stats.chisquare(counts).pvalue > 1e-3


def test_uniform_draws_every_stored_transition_alike_across_a_wrapped_ring():
    layout = TierLayout([100, 400, 1500], num_envs=4)  # 500 rows
    sampler = UniformSampler(layout, seed=0)
    drawn = [sampler.draw(500, stored_rows=500, pos=137) for _ in range(400)]
    rows, envs = np.concatenate([d.rows for d in drawn]), np.concatenate([d.envs for d in drawn])
    ages = (137 - 1 - rows) % 500
    assert uniform_over(ages, 500) and uniform_over(rows, 500)
    assert stats.chisquare(np.bincount(envs, minlength=4)).pvalue > 1e-3
    # levels are reported, in proportion to what they hold: 1/20, 4/20, 15/20
    shares = sampler.level_samples / sampler.level_samples.sum()
    assert np.allclose(shares, [0.05, 0.2, 0.75], atol=0.01)


def test_uniform_over_streams_of_unequal_fill_weighs_each_transition_alike():
    layout = TierLayout([30, 90], num_envs=3)  # 40 rows per stream
    sampler = UniformSampler(layout, seed=1)
    sizes, positions = np.array([40, 10, 0]), np.array([5, 10, 0])
    drawn = [sampler.draw_streams(250, sizes, positions) for _ in range(400)]
    envs = np.concatenate([d.envs for d in drawn])
    assert np.allclose(np.bincount(envs, minlength=3) / len(envs), [0.8, 0.2, 0.0], atol=0.01)
    rows = np.concatenate([d.rows for d in drawn])[envs == 1]
    assert set(rows.tolist()) == set(range(10))


def test_cer_puts_the_newest_transition_of_each_stream_in_every_batch():
    layout = TierLayout([40, 160], num_envs=4)  # 50 rows
    sampler = CerSampler(layout, seed=0)
    batches = [sampler.draw(64, stored_rows=50, pos=7) for _ in range(300)]
    for batch in batches:
        assert batch.rows[:4].tolist() == [6] * 4 and batch.envs[:4].tolist() == [0, 1, 2, 3]
    rest = np.concatenate([(7 - 1 - b.rows[4:]) % 50 for b in batches])
    assert uniform_over(rest, 50)
    assert CerSampler(layout, seed=0).draw(2, stored_rows=50, pos=7).rows.tolist() == [6, 6]  # batch < streams
    uneven = CerSampler(TierLayout([40, 160], num_envs=4), seed=0).draw_streams(
        8, np.array([3, 0, 9, 1]), np.array([3, 0, 9, 1]))
    assert uneven.envs[:3].tolist() == [0, 2, 3] and uneven.rows[:3].tolist() == [2, 8, 0]


def test_ere_sweeps_its_window_from_the_whole_buffer_to_c_min_as_the_paper_writes():
    layout = TierLayout([10_000], num_envs=1)
    sampler = EreSampler(layout, eta=0.99, c_min=100, updates=50, seed=0)
    stored = 10_000
    for k in range(1, 101):  # two sweeps of K = 50
        expected = max(int(stored * 0.99 ** (((k - 1) % 50 + 1) * 1000 / 50)), 100)
        batch = sampler.draw(256, stored_rows=stored, pos=0)
        ages = (0 - 1 - batch.rows) % stored
        assert ages.max() < expected and (k % 50 != 1 or ages.max() > expected * 0.9), k
    # inside one window the draw is uniform
    sampler = EreSampler(layout, eta=0.99, c_min=2000, updates=1, seed=0)  # every batch: k = K, c = c_min
    ages = np.concatenate([(0 - 1 - sampler.draw(500, stored, 0).rows) % stored for _ in range(200)])
    assert ages.max() < 2000 and uniform_over(ages, 2000)


def test_ere_anneals_eta_to_one_and_never_draws_beyond_what_is_stored():
    sampler = EreSampler(TierLayout([1000]), eta=0.9, c_min=10, updates=10)
    assert sampler.window_at(10, 1000, progress=0.0) == 10       # 1000 * 0.9**1000 is below c_min
    assert sampler.window_at(10, 1000, progress=0.5) == int(1000 * 0.95 ** 1000) or \
        sampler.window_at(10, 1000, progress=0.5) == 10
    assert sampler.window_at(10, 1000, progress=1.0) == 1000     # eta = 1: the whole buffer
    assert sampler.window_at(1, 5, progress=0.0) == 5            # c_min beyond the stored data
    streams = EreSampler(TierLayout([100, 100], num_envs=2), eta=0.9, c_min=4, updates=1, seed=0)
    batch = streams.draw_streams(500, np.array([100, 20]), np.array([100, 20]))
    ages = np.where(batch.envs == 0, 99 - batch.rows, 19 - batch.rows)
    assert ages.min() >= 0 and set(np.unique(batch.envs)) <= {0, 1}


def test_engine_with_a_scheme_samples_stored_data_and_resumes_its_sweep_exactly():
    buf = rla.TieredReplay([20, 80], [0.5, 0.5], num_envs=2, sampling="ere", ere_c_min=4, ere_updates=5,
                           anneal_steps=1000, seed=3)
    for t in range(70):
        buf.add(**vector_transition(t, 2))
    for _ in range(3):
        buf.sample(16)
    twin = rla.TieredReplay([20, 80], [0.5, 0.5], num_envs=2, sampling="ere", ere_c_min=4, ere_updates=5,
                            anneal_steps=1000)
    twin.load_state_dict(buf.state_dict())
    for _ in range(7):
        a, b = buf.sample(16), twin.sample(16)
        assert np.array_equal(a.indices, b.indices) and a.weights is None
        assert set(a.data["action"].tolist()) <= set(range(140))
    assert rla.TieredReplay.from_config(rla.load_config(sampling="cer")).config.sampling == "cer"


def test_make_sampler_follows_the_config_and_bad_values_are_refused_clearly():
    layout = TierLayout([10, 90])
    assert type(make_sampler(layout, rla.load_config(sampling="tiers").replay_buffer)).__name__ == "TieredSampler"
    for preset in set(rla.preset_names()) - {"default", "off", "atari"}:  # the study's finding: uniform on their tasks
        assert rla.get_preset(preset).replay_buffer.sampling == "uniform", preset
    assert rla.get_preset("atari").replay_buffer.sampling == "auto"  # images: as the pixel study decided per family
    assert rla.get_preset("off").replay_buffer.levels == 1  # one level: its tiers sampler draws uniformly
    assert rla.load_config().replay_buffer.sampling == "auto"  # resolved per algorithm family by the adapters
    assert rla.TieredReplay.from_config(rla.load_config()).config.sampling == "uniform"  # no family known
    with pytest.raises(ConfigError, match=r"sampling must be one of .* here, got sampling='auto'.*resolve_sampling"):
        make_sampler(layout, rla.load_config().replay_buffer)  # auto needs the family: the caller resolves it
    with pytest.raises(ConfigError, match=r"sampling must be one of .*got sampling='eer'.*Did you mean 'ere'"):
        rla.load_config(sampling="eer")
    with pytest.raises(ConfigError, match="importance_beta must be unset with sampling='cer'"):
        rla.load_config(sampling="cer", importance_beta=0.4)
    with pytest.raises(ConfigError, match=r"ere_eta must be in \(0, 1\], got ere_eta=1.5"):
        rla.load_config(ere_eta=1.5)
    with pytest.raises(ConfigError, match="ere_updates must be >= 1"):
        rla.load_config(ere_updates=0)


def test_ratios_a_user_sets_are_used_whatever_sampling_the_preset_has():
    uniform = rla.load_config(sampling="uniform")
    assert uniform.merged({"sampling_ratio": [0.4, 0.3, 0.2, 0.1]}).replay_buffer.sampling == "tiers"
    assert uniform.merged({"ratio_schedule": "anneal"}).replay_buffer.sampling == "tiers"
    assert uniform.merged({"batch_size": 64}).replay_buffer.sampling == "uniform"
    assert uniform.merged({"sampling_ratio": [0.4, 0.3, 0.2, 0.1], "sampling": "cer"}).replay_buffer.sampling == "cer"
    assert rla.load_config(uniform.to_dict()).replay_buffer.sampling == "uniform"  # a whole saved config: as saved


def test_every_scheme_named_by_the_config_is_registered_and_keeps_the_sampler_contract():
    from rlaccel_plugins.config import SCHEME_SETTINGS
    from rlaccel_plugins.replay.schemes import SCHEMES, Sampler

    assert list(SCHEMES) == list(SCHEME_SETTINGS)  # the config's one list of schemes, each with its sampler
    layout = TierLayout([10, 90], num_envs=2)
    for name in SCHEMES:
        replay = rla.load_config(sampling=name, levels=2, level_capacity=[10, 90], sampling_ratio=[0.5, 0.5],
                                 ere_c_min=10).replay_buffer
        sampler = make_sampler(layout, replay, seed=0)
        assert all(hasattr(sampler, a) for a in (*Sampler.__annotations__, "draw", "draw_streams", "state_dict"))
        drawn = sampler.draw(32, stored_rows=50, pos=50)
        assert len(drawn.rows) == 32 and sampler.level_samples.sum() == 32
        state = sampler.state_dict()
        again = sampler.draw(8, stored_rows=50, pos=50).rows
        sampler.load_state_dict(state)
        assert np.array_equal(sampler.draw(8, stored_rows=50, pos=50).rows, again), name
