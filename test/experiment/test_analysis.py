import json
import math

import numpy as np
import pandas as pd
import pytest

from slm_lab.experiment import analysis
from slm_lab.experiment.analysis import (
    SESSION_SCALARS, _random_baseline, baseline_cache_key, baseline_cache_path, calc_session_metrics,
    calc_trial_metrics, random_baseline,
)


def session_df(total_reward_ma, frame=None, opt_step=None) -> pd.DataFrame:
    n = len(total_reward_ma)
    frame = list(range(0, 100 * n, 100)) if frame is None else frame
    opt_step = list(range(n)) if opt_step is None else opt_step
    return pd.DataFrame({
        'epi': range(n), 't': range(n), 'wall_t': range(n), 'opt_step': opt_step, 'frame': frame,
        'fps': 100.0, 'total_reward': total_reward_ma, 'total_reward_ma': total_reward_ma,
        'loss': np.nan, 'lr': 1e-3, 'explore_var': np.nan, 'entropy_coef': np.nan,
        'entropy': np.nan, 'grad_norm': np.nan,
    })


def test_hand_computed_strength_and_efficiency():
    # strengths 2, 4, 8; frame 0 counts as 1, so frame weights are 1, 1/2, 1/4
    df = session_df([3.0, 5.0, 9.0], frame=[0, 2, 4], opt_step=[1, 1, 2])
    metrics = calc_session_metrics(df, rand_return=1.0)
    scalar, local = metrics['scalar'], metrics['local']
    assert scalar['final_return_ma'] == 9.0
    assert scalar['strength'] == pytest.approx(14 / 3)
    assert scalar['max_strength'] == 8.0
    assert scalar['final_strength'] == 8.0
    # (2*1 + 4/2 + 8/4) / (1 + 1/2 + 1/4) = 6 / 1.75
    assert scalar['sample_efficiency'] == pytest.approx(6 / 1.75)
    assert local['sample_efficiency'] == pytest.approx([2.0, 4 / 1.5, 6 / 1.75])
    # (2/1 + 4/1 + 8/2) / (1 + 1 + 1/2) = 10 / 2.5
    assert scalar['training_efficiency'] == pytest.approx(4.0)
    assert local['training_efficiency'] == pytest.approx([2.0, 3.0, 4.0])
    assert local['strength'] == [2.0, 4.0, 8.0]
    assert local['frame'] == [0.0, 2.0, 4.0]
    assert local['opt_step'] == [1.0, 1.0, 2.0]
    assert scalar['stability'] == 1.0


def test_monotonic_return_is_fully_stable_and_a_dip_is_counted():
    rising = calc_session_metrics(session_df([1.0, 2.0, 2.0, 5.0, 9.0]), rand_return=0.0)
    assert rising['scalar']['stability'] == 1.0
    # pairs: up, down, up, down -> 2 of 4 do not decrease
    dipping = calc_session_metrics(session_df([1.0, 3.0, 2.0, 4.0, 0.0]), rand_return=0.0)
    assert dipping['scalar']['stability'] == 0.5
    single = calc_session_metrics(session_df([7.0]), rand_return=0.0)
    assert single['scalar']['stability'] == 1.0


def test_rows_before_the_first_episode_are_dropped():
    df = session_df([np.nan, np.nan, 4.0, 6.0], frame=[0, 10, 20, 40])
    metrics = calc_session_metrics(df, rand_return=2.0)
    assert metrics['local']['strength'] == [2.0, 4.0]
    assert metrics['local']['frame'] == [20.0, 40.0]
    assert metrics['scalar']['strength'] == 3.0
    assert metrics['scalar']['sample_efficiency'] == pytest.approx((2 / 20 + 4 / 40) / (1 / 20 + 1 / 40))


@pytest.mark.parametrize('df', [
    pd.DataFrame(),
    session_df([]),
    session_df([np.nan, np.nan]),
    pd.DataFrame({'frame': [0, 1]}),  # no total_reward_ma column at all
], ids=['no-columns', 'no-rows', 'all-nan', 'missing-column'])
def test_no_data_gives_none_scalars_and_empty_locals(df):
    metrics = calc_session_metrics(df, rand_return=0.0)
    assert metrics['scalar'] == {name: None for name in SESSION_SCALARS}
    assert all(values == [] for values in metrics['local'].values())


def test_metrics_are_plain_json():
    df = session_df([np.nan, 1.0, 2.0], frame=[0, 100, 200])
    df['opt_step'] = np.nan  # no optimizer step recorded: training efficiency is unknown
    metrics = calc_session_metrics(df, rand_return=0.5)
    assert metrics['scalar']['training_efficiency'] is None
    assert metrics['local']['training_efficiency'] == [None, None]
    json.dumps(metrics, allow_nan=False)
    assert all(type(v) is float for v in metrics['scalar'].values() if v is not None)
    trial = calc_trial_metrics([metrics, metrics])
    json.dumps(trial, allow_nan=False)


def test_identical_sessions_are_fully_consistent():
    metrics = calc_session_metrics(session_df([1.0, 3.0, 2.0]), rand_return=0.0)
    trial = calc_trial_metrics([metrics, metrics, metrics])
    assert trial['scalar']['consistency'] == 1.0
    assert trial['scalar']['strength'] == metrics['scalar']['strength']
    assert trial['local']['strength_mean'] == [1.0, 3.0, 2.0]
    assert trial['local']['strength_std'] == [0.0, 0.0, 0.0]
    assert calc_trial_metrics([metrics])['scalar']['consistency'] == 1.0


def test_trial_consistency_and_means_by_hand():
    a = calc_session_metrics(session_df([2.0, 4.0, 100.0]), rand_return=0.0)
    b = calc_session_metrics(session_df([4.0, 4.0]), rand_return=0.0)
    trial = calc_trial_metrics([a, b])
    # cut to 2 rows; row 0: mean 3, std 1 -> 1 - 1/3; row 1: mean 4, std 0 -> 1
    assert trial['scalar']['consistency'] == pytest.approx((2 / 3 + 1) / 2)
    assert trial['local']['frame'] == [0.0, 100.0]
    assert trial['local']['strength_mean'] == [3.0, 4.0]
    assert trial['local']['strength_std'] == [1.0, 0.0]
    assert trial['scalar']['final_return_ma'] == pytest.approx((100.0 + 4.0) / 2)


def test_consistency_where_the_mean_strength_is_zero():
    up = calc_session_metrics(session_df([0.0, 1.0]), rand_return=0.0)
    down = calc_session_metrics(session_df([0.0, -1.0]), rand_return=0.0)
    # row 0: both 0 -> 1; row 1: mean 0 but spread -> 0
    assert calc_trial_metrics([up, down])['scalar']['consistency'] == 0.5


def test_trial_skips_sessions_without_data():
    good = calc_session_metrics(session_df([1.0, 2.0]), rand_return=0.0)
    empty = calc_session_metrics(pd.DataFrame(), rand_return=0.0)
    trial = calc_trial_metrics([good, empty])
    assert trial['scalar']['strength'] == good['scalar']['strength']
    assert trial['scalar']['consistency'] is None  # no row is shared by all sessions
    assert trial['local'] == {'frame': [], 'strength_mean': [], 'strength_std': []}
    assert calc_trial_metrics([])['scalar']['consistency'] is None


CARTPOLE = {'name': 'CartPole-v1'}


def test_random_baseline_is_reproducible_and_memoised():
    key = json.dumps({'make_kwargs': {}, 'max_t': None, 'name': 'CartPole-v1'}, sort_keys=True)
    first = _random_baseline(key, 5, 20000, 3)
    assert first == _random_baseline(key, 5, 20000, 3)
    assert 5 < first < 100  # a random CartPole policy lasts tens of steps at +1 per step
    assert random_baseline(CARTPOLE, episodes=5, seed=3) == first
    memo = dict(analysis._memo)
    # the same env however the spec spells it (defaults given or left out): one value
    assert random_baseline({'name': 'CartPole-v1', 'max_t': None, 'make_kwargs': {}}, episodes=5, seed=3) == first
    assert analysis._memo == memo


def test_random_baseline_cache_on_disk_is_read_back_and_keyed(tmp_path):
    env_key = json.dumps({'make_kwargs': {}, 'max_t': None, 'name': 'CartPole-v1'}, sort_keys=True)
    played = _random_baseline(env_key, 4, 20000, 7)
    assert random_baseline(CARTPOLE, episodes=4, seed=7, cache_dir=tmp_path) == played
    key = baseline_cache_key(env_key, 4, 20000, 7)
    path = baseline_cache_path(tmp_path, key)
    assert json.loads(path.read_text()) == {'key': key, 'random_baseline': played}
    assert key['packages']['gymnasium'] and key['lab_version']
    # a later process reads the file instead of playing: a value only the file holds comes back
    path.write_text(json.dumps({'key': key, 'random_baseline': 123.5}))
    assert _random_baseline(env_key, 4, 20000, 7, str(tmp_path)) == 123.5
    # a file holding another key (a different package version) or a damaged one is played again and rewritten
    path.write_text(json.dumps({'key': {**key, 'packages': {}}, 'random_baseline': 123.5}))
    assert _random_baseline(env_key, 4, 20000, 7, str(tmp_path)) == played
    path.write_text('{"key": ')
    assert _random_baseline(env_key, 4, 20000, 7, str(tmp_path)) == played
    assert json.loads(path.read_text())['random_baseline'] == played
    # other settings are other files
    assert baseline_cache_path(tmp_path, baseline_cache_key(env_key, 4, 20000, 8)) != path


def test_random_baseline_cache_dir_is_the_data_dirs_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv(analysis.CACHE_DIR_ENV)
    assert analysis.baseline_cache_dir(tmp_path / 'data') == tmp_path / 'data' / '.cache'
    monkeypatch.setenv(analysis.CACHE_DIR_ENV, str(tmp_path / 'elsewhere'))
    assert analysis.baseline_cache_dir(tmp_path / 'data') == tmp_path / 'elsewhere'


def test_random_baseline_stops_at_max_frames_with_a_partial_return():
    # CartPole cannot fail within 5 steps, so the baseline is the partial return 5 * (+1)
    assert random_baseline(CARTPOLE, max_frames=5) == 5.0
    assert math.isfinite(random_baseline({'name': 'Pendulum-v1'}, episodes=1))


def test_random_baseline_uses_the_env_specs_step_limit_and_make_kwargs():
    # max_t 5: every episode is truncated after 5 steps of +1
    assert random_baseline({'name': 'CartPole-v1', 'max_t': 5}) == 5.0
    # Sutton & Barto's CartPole rewards: 0 per step and -1 when the pole falls, which a random
    # policy always lets happen within the env's 500 steps
    assert random_baseline({'name': 'CartPole-v1', 'make_kwargs': {'sutton_barto_reward': True}}) == -1.0
