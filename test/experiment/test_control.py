"""Sessions and trials: a seed makes a run repeatable; a trial runs and aggregates its sessions."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

TIMING = ['wall_t', 'fps']  # the only columns allowed to differ between two runs of one seed


def records(run_dir, name: str, session: int = 0) -> dict[str, pd.DataFrame]:
    return {m: pd.read_csv(run_dir / 'info' / f'{name}_t0_s{session}_session_df_{m}.csv').drop(columns=TIMING)
            for m in ('train', 'eval')}


def small_spec(make_spec, algorithm: str, seed: int | None) -> dict:
    num_envs = 2 if algorithm == 'PPO' else 1
    return make_spec(algorithm, max_frame=256, num_envs=num_envs, log_frequency=32, random_seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize('algorithm', ['PPO', 'DQN', 'Reinforce'])
def test_same_seed_same_numbers(lab_run, make_spec, algorithm):
    spec = small_spec(make_spec, algorithm, seed=123)
    _, first = lab_run(spec, 'seeded')
    _, second = lab_run(spec, 'seeded')
    assert first != second
    a, b = records(first, 'seeded'), records(second, 'seeded')
    for df_mode in ('train', 'eval'):
        assert a[df_mode]['opt_step'].iloc[-1] > 0
        pd.testing.assert_frame_equal(a[df_mode], b[df_mode], check_exact=True)
    model_a = torch.load(first / 'model' / 'seeded_t0_s0_model_latest.pt', weights_only=True)['nets']
    model_b = torch.load(second / 'model' / 'seeded_t0_s0_model_latest.pt', weights_only=True)['nets']
    for net, weights in model_a.items():
        for key, value in weights.items():
            assert torch.equal(value, model_b[net][key]), f'{net}.{key} differs between runs of one seed'


@pytest.mark.slow
@pytest.mark.parametrize('algorithm', ['PPO', 'DQN'])
def test_different_seed_different_numbers(lab_run, make_spec, algorithm):
    _, first = lab_run(small_spec(make_spec, algorithm, seed=1), 'seeded')
    _, second = lab_run(small_spec(make_spec, algorithm, seed=2), 'seeded')
    a, b = records(first, 'seeded')['train'], records(second, 'seeded')['train']
    assert not a[['total_reward', 'loss']].equals(b[['total_reward', 'loss']])


def test_unseeded_runs_draw_and_record_a_seed(lab_run, make_spec):
    spec = make_spec('Random', max_frame=64, random_seed=None)
    _, run_dir = lab_run(spec, 'unseeded')
    seed = json.loads((run_dir / 'unseeded_t0_s0_spec.json').read_text())['meta']['random_seed']
    assert isinstance(seed, int) and seed >= 0


@pytest.mark.slow
def test_two_session_trial(lab_run, make_spec):
    spec = make_spec('PPO', max_frame=128, num_envs=2, log_frequency=32, random_seed=7, max_session=2)
    metrics, run_dir = lab_run(spec, 'two')
    for s in (0, 1):
        prename = f'two_t0_s{s}'
        meta = json.loads((run_dir / f'{prename}_spec.json').read_text())['meta']
        assert meta['session'] == s and meta['random_seed'] == 7 + s  # the seed session s used
        for df_mode in ('train', 'eval'):
            df = pd.read_csv(run_dir / 'info' / f'{prename}_session_df_{df_mode}.csv')
            assert df['frame'].iloc[-1] == 128
        assert (run_dir / 'info' / f'{prename}_session_metrics.json').exists()
        assert (run_dir / 'model' / f'{prename}_model_latest.pt').exists()
        assert (run_dir / 'graph' / f'{prename}_session_graph.html').exists()
        assert 'frame 128/128' in (run_dir / 'log' / f'{prename}.log').read_text()
    # sessions are seeded differently (random_seed + s), so their records differ
    s0, s1 = records(run_dir, 'two', 0)['train'], records(run_dir, 'two', 1)['train']
    assert not s0.equals(s1)
    trial_metrics = json.loads((run_dir / 'info' / 'two_t0_trial_metrics.json').read_text())
    assert trial_metrics == json.loads(json.dumps(metrics))
    consistency = trial_metrics['scalar']['consistency']
    assert consistency is not None and 0.0 <= consistency <= 1.0
    assert len(trial_metrics['local']['strength_mean']) == 4
    assert (run_dir / 'graph' / 'two_t0_trial_graph.html').stat().st_size > 0
