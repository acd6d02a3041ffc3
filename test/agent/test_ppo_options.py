"""PPO's SLM-Lab v5 options and whole-episode training: normalize_v_targets, normalize_advantages
"percentile", PPO on OnPolicyReplay; each on hand-computed numbers, and exact resume with them.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_algorithm
from lab_helpers import check_resume_after_max_frame, value_from_first_entry

from slm_lab.agent.algorithm.ppo import PercentileNormalizer
from slm_lab.lib.errors import SpecError
from slm_lab.spec import validate_spec


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def ppo_spec(memory: str = 'OnPolicyBatchReplay', num_envs: int = 1, max_frame: int = 100, **algo) -> dict:
    algorithm = {'name': 'PPO', 'gamma': 0.99, 'lam': 0.95, 'time_horizon': 16, 'minibatch_size': 8,
                 'training_epoch': 2, 'entropy_coef_spec': {'name': 'no_decay', 'start_val': 0.01}, **algo}
    return {'agent': {'name': 'ppo', 'algorithm': algorithm, 'memory': {'name': memory},
                      'net': {'type': 'MLPNet', 'hid_layers': [16], 'hid_layers_activation': 'tanh', 'shared': True,
                              'optim_spec': {'name': 'Adam', 'lr': 1e-3}}},
            'env': {'name': 'CartPole-v1', 'num_envs': num_envs, 'max_frame': max_frame},
            'meta': {'log_frequency': max(max_frame // 4, num_envs), 'random_seed': 42}}


# --- normalize_advantages "percentile" ------------------------------------------------------------
# advantages 0, 100, ..., 1000 (11 values): q05 = 0.05 * 10 = 0.5th step = 50, q95 = 950
# first update:  P5 = 0.01 * 50 = 0.5,            P95 = 0.01 * 950 = 9.5,          scale 9.5 - 0.5 = 9
# second update: P5 = 0.99 * 0.5 + 0.5 = 0.995,   P95 = 0.99 * 9.5 + 9.5 = 18.905, scale 17.91
SPREAD = [100.0 * i for i in range(11)]


def test_percentile_normalizer_tracks_moving_percentiles_and_divides_by_their_range():
    norm = PercentileNormalizer()
    norm.update(t(SPREAD))
    assert (norm.perc5, norm.perc95) == (pytest.approx(0.5), pytest.approx(9.5))
    torch.testing.assert_close(norm.scale(t([900.0, -9.0])), t([100.0, -1.0]))
    norm.update(t(SPREAD))
    assert (norm.perc5, norm.perc95) == (pytest.approx(0.995), pytest.approx(18.905))
    torch.testing.assert_close(norm.scale(t([17.91])), t([1.0]))


def test_percentile_normalizer_never_enlarges_and_never_centres():
    norm = PercentileNormalizer()
    norm.update(t([-1.0, 0.0, 1.0]))  # range 0.01 * 1.8 < 1: divided by 1
    torch.testing.assert_close(norm.scale(t([0.3, -0.2])), t([0.3, -0.2]))


def test_ppo_percentile_replaces_standardizing_and_is_kept_in_the_state():
    algo = make_algorithm(ppo_spec(normalize_advantages='percentile'))
    torch.testing.assert_close(algo.normalize_advantages(t(SPREAD))[-1], torch.tensor(1000.0 / 9))
    state = algo.state_dict()['extra']['percentile_normalizer']
    assert state == {'perc5': pytest.approx(0.5), 'perc95': pytest.approx(9.5)}
    standard = make_algorithm(ppo_spec())
    assert 'percentile_normalizer' not in standard.state_dict()['extra']
    torch.testing.assert_close(standard.normalize_advantages(t([1.0, 3.0])), t([-1.0, 1.0]) / 2 ** 0.5)


def test_percentile_contradicts_normalize_advantage_false():
    with pytest.raises(SpecError, match='agent.algorithm.normalize_advantages: "percentile" contradicts'):
        validate_spec(ppo_spec(normalize_advantages='percentile', normalize_advantage=False))


# --- normalize_v_targets ---------------------------------------------------------------------------

def test_ppo_normalize_v_targets_scales_values_and_targets_by_the_running_std():
    algo = make_algorithm(ppo_spec(normalize_v_targets=True))
    # targets [0, 4]: population var 4, std 2 -> MSE((1, 3) / 2, (0, 4) / 2) = 0.25 (without it: 1)
    torch.testing.assert_close(algo.ppo_value_loss(t([1, 3]), t([1, 3]), t([0, 4]), 0.2), torch.tensor(0.25))
    assert algo.state_dict()['extra']['return_normalizer']['count'] == 2
    plain = make_algorithm(ppo_spec())
    torch.testing.assert_close(plain.ppo_value_loss(t([1, 3]), t([1, 3]), t([0, 4]), 0.2), torch.tensor(1.0))


def test_ppo_normalize_v_targets_leaves_the_clipped_value_loss_alone():
    # SLM-Lab v5's clip_vloss branch never calls the normaliser
    algo = make_algorithm(ppo_spec(normalize_v_targets=True, clip_vloss=True))
    # unclipped (V moves by 0 from V_old): MSE per sample (1, 1) -> 1
    torch.testing.assert_close(algo.ppo_value_loss(t([1, 3]), t([1, 3]), t([0, 4]), 0.2), torch.tensor(1.0))
    assert algo.return_normalizer.count == 0


# --- PPO on whole episodes ---------------------------------------------------------------------------
# gamma = lam = 0.5; episode A: 2 steps, terminated; episode B: 1 step, truncated. rewards 1 1 1,
# V(s) 1 2 3, V(s') 2 10 5. deltas 1, -1 (no bootstrap), 0.5 (bootstrapped) ->
# A = 0.75, -1, 0.5; R = A + V = 1.75, 1, 3.5

def test_ppo_on_episodes_trains_after_training_frequency_episodes_with_gae(monkeypatch):
    algo = make_algorithm(ppo_spec('OnPolicyReplay', gamma=0.5, lam=0.5, training_frequency=2))
    value_from_first_entry(algo)
    seen = {}
    monkeypatch.setattr(algo, 'train', lambda batch: seen.setdefault('batch', batch))
    for step, (v, v_next, terminated, truncated) in enumerate([(1, 2, False, False), (2, 10, True, False),
                                                               (3, 5, False, True)]):
        obs, next_obs = np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32)
        obs[0, 0], next_obs[0, 0] = v, v_next
        algo.update(obs, np.zeros(1, np.int64), np.ones(1, np.float32), next_obs, np.array([terminated]),
                    np.array([truncated]))
        assert ('batch' in seen) == (step == 2), 'trains once two episodes have ended'
    advs, returns, old_values = algo.advantages(seen['batch'])
    torch.testing.assert_close(advs, t([0.75, -1, 0.5]))
    torch.testing.assert_close(returns, t([1.75, 1, 3.5]))
    torch.testing.assert_close(old_values, t([1, 2, 3]))


def test_ppo_on_episodes_needs_a_whole_number_of_episodes():
    with pytest.raises(SpecError, match='agent.algorithm.training_frequency'):
        validate_spec(ppo_spec('OnPolicyReplay', training_frequency=0.5))


# --- exact resume -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_ppo_with_normalized_targets_and_percentile_advantages_resumes_exactly(tmp_path):
    spec = ppo_spec(num_envs=2, max_frame=1024, normalize_v_targets=True, normalize_advantages='percentile')
    spec['meta']['log_frequency'] = 256
    check_resume_after_max_frame(tmp_path, 'ppo_norm', spec)


@pytest.mark.slow
def test_ppo_on_episodes_resumes_exactly(tmp_path):
    spec = ppo_spec('OnPolicyReplay', num_envs=2, max_frame=1024, training_frequency=2, normalize_v_targets=True)
    spec['meta']['log_frequency'] = 256
    check_resume_after_max_frame(tmp_path, 'ppo_episodes', spec)


def test_ppo_with_self_imitation_keys_runs_as_slm_lab_ran_it_and_points_to_pposil(caplog):
    # SLM-Lab's lunar_pg.json names PPO with SIL's keys (its ppo_sil_* specs); SLM-Lab's PPO does
    # not read them, so they trained plain PPO: they run so here too, with a warning naming PPOSIL
    from slm_lab.lib.logger import warn_once
    warn_once.cache_clear()  # one warning per process
    spec = ppo_spec(sil_policy_loss_coef=0.5)
    spec['agent']['memory']['sil_replay_name'] = 'Replay'
    with caplog.at_level('WARNING'):
        validated = validate_spec(spec)
    assert validated['agent']['algorithm']['sil_policy_loss_coef'] == 0.5
    (line,) = [r.getMessage() for r in caplog.records if 'self-imitation' in r.getMessage()]
    assert line.startswith('agent.algorithm.sil_policy_loss_coef, agent.memory.sil_replay_name: ')
    assert '"PPOSIL"' in line
    warn_once.cache_clear()
    with caplog.at_level('WARNING'):
        validate_spec(ppo_spec())
    assert len([r for r in caplog.records if 'self-imitation' in r.getMessage()]) == 1  # none without the keys
    spec['agent']['algorithm']['name'] = 'PPOSIL'
    assert validate_spec(spec)['agent']['algorithm']['sil_policy_loss_coef'] == 0.5


@pytest.mark.slow
@pytest.mark.parametrize('spec_file, name, fast_option', [('ppo/ppo_cartpole_zoo.json', 'ppo_cartpole_zoo', 'fused'),
                                                          ('a2c/a2c_cartpole_zoo.json', 'a2c_cartpole_zoo', 'foreach')])
def test_zoo_specs_resume_exactly_on_their_fast_optimizer_paths(tmp_path, spec_file, name, fast_option):
    # fused Adam stepped directly (ppo) and foreach RMSprop (a2c), the speed opt-ins that
    # bench/sb3_side_by_side.py's fast column sets, carry their state through a snapshot
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / 'spec' / 'benchmark' / spec_file
    spec = json.loads(path.read_text())[name]
    spec['agent']['net']['optim_spec'][fast_option] = True
    spec['env']['max_frame'] = 1024
    spec['meta'].update(log_frequency=256, eval_frequency=512, random_seed=3)
    if 'lr_scheduler_spec' in spec['agent']['net']:  # LinearToZero ends at max_frame, which the resume raises
        spec['agent']['net']['lr_scheduler_spec']['frame'] = 100000
    check_resume_after_max_frame(tmp_path, name, spec)


# --- keep_acting_outputs across a run's life -------------------------------------------------------------

def acting_spec(**algo) -> dict:
    """A shared-net PPO whose stops fall mid-rollout: 32 frames a rollout, a record every 50."""
    spec = ppo_spec(num_envs=2, max_frame=200, **algo)
    spec['meta']['eval_frequency'] = 100
    return spec


@pytest.mark.slow
def test_ppo_keeping_acting_outputs_resumes_mid_rollout_as_the_run_that_never_stopped(tmp_path):
    # the stop at frame 200 falls 4 vector steps into a rollout: their recorded log-probs and
    # values are in the snapshot, and the resumed update uses them as the straight one does
    check_resume_after_max_frame(tmp_path, 'ppo_acting', acting_spec())


@pytest.mark.slow
def test_a_ppo_run_saved_before_keep_acting_outputs_resumes_with_the_batch_forward(tmp_path):
    from lab_helpers import assert_same_run, drop_saved_key, saved_values, spec_file_in, train_one
    name, key = 'ppo_acting', 'agent.algorithm.keep_acting_outputs'
    new_file = spec_file_in(tmp_path / 'new', name, acting_spec())
    assert saved_values(train_one(new_file, name, 'train', [], tmp_path / 'fresh'), name, key) == [True] * 3
    old_file = spec_file_in(tmp_path / 'old', name, acting_spec(keep_acting_outputs=False))
    old = train_one(old_file, name, 'train', [], tmp_path / 'a')
    drop_saved_key(old, name, key)  # as a lab before the key saved it
    # resumed under the user's spec file, which does not name the key either
    lab_run = train_one(new_file, name, f'train@{old}', ['env.max_frame=400'], tmp_path / 'a')
    assert saved_values(lab_run, name, key) == [False] * 3
    straight = train_one(old_file, name, 'train', ['env.max_frame=400'], tmp_path / 'b')
    assert_same_run(lab_run, straight, name)
