"""Defaults that follow another key, in a search: each trial fills them from what it drew, as SLM-Lab
fills them for each run, and a resumed search's new trials do the same (the search's spec leaves
them out, or null, and reading it back does not take their absence for a spec saved before them).
No Ray: a trial's spec is the search's spec with the drawn values set, validated (trial_spec)."""
from __future__ import annotations

import copy
import json

from lab_helpers import DQN, PENDULUM, PPO

from slm_lab.experiment.search.specs import resume_spec, trial_spec
from slm_lab.persistence.edits import fill_keys_added_later
from slm_lab.spec import load_run_spec, validate_spec

NAME = 'defaults_search'


def searching(base: dict, search: dict, drop: tuple[str, ...] = (), **env) -> dict:
    """A search spec made of one of the suite's small specs (lab_helpers), its algorithm keys in
    `drop` left to their defaults."""
    raw = copy.deepcopy(base)
    for key in drop:
        raw['agent']['algorithm'].pop(key)
    raw['env'].update(env)
    raw['meta'] = {**raw['meta'], 'max_trial': 4, 'max_session': 1}
    return {**raw, 'search': search}


def ppo(search: dict, **env) -> dict:
    return searching(PPO, search, **env)


def dqn(search: dict) -> dict:  # training_start_step left to its default, which follows batch_size
    return searching(DQN, search, drop=('training_start_step',))


def sac(search: dict) -> dict:  # training_iter and training_start_step left to their defaults
    base = {**PENDULUM, 'agent': {'name': 'SAC', 'algorithm': {'name': 'SoftActorCritic', 'action_pdtype': 'Normal'},
                                  'memory': {'name': 'Replay', 'batch_size': 64, 'max_size': 10000},
                                  'net': PENDULUM['agent']['net']}}
    return searching(base, search)


def search_of(raw: dict) -> dict:
    return {**validate_spec(raw, settle=False), 'name': NAME}


def write(tmp_path, raw: dict) -> str:
    path = tmp_path / f'{NAME}.json'
    path.write_text(json.dumps({NAME: raw}))
    return str(path)


def resumed(tmp_path, raw: dict, saved: dict | None = None) -> dict:
    """The spec search@ continues under, from the search's saved spec (written by this lab unless
    `saved`), with no edit found (resume_spec refuses any)."""
    spec_file = write(tmp_path, raw)
    saved = saved or load_run_spec(spec_file, NAME, 'search', None)
    spec, _ = resume_spec(spec_file, NAME, None, copy.deepcopy(saved), force=False, mode='search@latest')
    return spec


def test_clipping_follows_each_trials_normalisation_and_a_given_value_stays(tmp_path):
    """SLM-Lab's clip_obs / clip_reward: 10 with normalize_obs / normalize_reward on, none off, in
    each trial; a value the spec gives stays for every trial. (A search over the whole env sets
    each trial's env whole, which fills its own.)"""
    raw = ppo({'env': {'normalize_obs__choice': [True, False]}, 'env.normalize_reward__choice': [True, False]})
    search = search_of(raw)
    assert 'clip_obs' not in search['env'] and 'clip_reward' not in search['env']
    for obs in (True, False):
        for rew in (True, False):
            env = trial_spec(search, {'env.normalize_obs': obs, 'env.normalize_reward': rew}, 0)['env']
            assert (env['clip_obs'], env['clip_reward']) == (10.0 if obs else None, 10.0 if rew else None)
    given = search_of(ppo(raw['search'], clip_obs=5.0, clip_reward=2.0))
    assert (given['env']['clip_obs'], given['env']['clip_reward']) == (5.0, 2.0)
    env = trial_spec(given, {'env.normalize_obs': False, 'env.normalize_reward': True}, 0)['env']
    assert (env['clip_obs'], env['clip_reward']) == (5.0, 2.0)
    # what train validates (it ignores the search block), and a search that does not draw them: filled
    assert validate_spec(raw)['env']['clip_obs'] is None
    plain = ppo({'agent.algorithm.gamma__uniform': [0.9, 0.99]}, normalize_obs=True)
    assert search_of(plain)['env']['clip_obs'] == 10.0


def test_v4_blocks_and_an_atari_id_are_read_the_same_way():
    """SLM-Lab v4's one-element env list in the block; a search over env.name: an ALE/ game's
    rewards are clipped to 1 (SLM-Lab v5's Atari default), a CartPole's not."""
    search = search_of(ppo({'env': [{'normalize_obs__choice': [True, False]}]}))
    assert 'clip_obs' not in search['env']
    search = search_of(ppo({'env.name__choice': ['CartPole-v1', 'ALE/Pong-v5']}))
    assert 'clip_reward' not in search['env']
    assert trial_spec(search, {'env.name': 'ALE/Pong-v5'}, 0)['env']['clip_reward'] == 1.0
    assert trial_spec(search, {'env.name': 'CartPole-v1'}, 0)['env']['clip_reward'] is None


def test_training_start_and_iterations_follow_each_trials_batch_and_env_count():
    """DQN starts training once one batch can be sampled, SAC after max(1000, batch) frames with one
    gradient step per frame of a vector step: from the trial's drawn batch_size and num_envs."""
    search = search_of(dqn({'agent.memory.batch_size__choice': [32, 256]}))
    assert search['agent']['algorithm']['training_start_step'] is None
    for batch in (32, 256):
        algo = trial_spec(search, {'agent.memory.batch_size': batch}, 0)['agent']['algorithm']
        assert algo['training_start_step'] == batch
    search = search_of(sac({'env.num_envs__choice': [1, 4], 'agent.memory.batch_size__choice': [64, 2048]}))
    assert search['agent']['algorithm']['training_iter'] is None
    assert search['agent']['algorithm']['training_start_step'] is None
    algo = trial_spec(search, {'env.num_envs': 4, 'agent.memory.batch_size': 2048}, 0)['agent']['algorithm']
    assert (algo['training_iter'], algo['training_start_step']) == (4, 2048)
    # not drawn: filled in the search's spec as in a train run's
    plain = search_of(sac({'agent.algorithm.gamma__uniform': [0.9, 0.99]}))
    algo = plain['agent']['algorithm']
    assert (algo['training_iter'], algo['training_start_step']) == (plain['env']['num_envs'], 1000)


def test_fused_follows_each_trials_optimizer(tmp_path):
    """Adam steps fused by default; a search over the optimizer's name gives an RMSprop or SGD
    trial no `fused` (not the base Adam's, which RMSprop refuses), an Adam trial true, before and
    after a resume."""
    raw = ppo({'agent.net.optim_spec.name__choice': ['Adam', 'RMSprop', 'SGD']})
    search = search_of(raw)
    assert 'fused' not in search['agent']['net']['optim_spec']
    optims = {name: trial_spec(search, {'agent.net.optim_spec.name': name}, 0)['agent']['net']['optim_spec']
              for name in ('Adam', 'RMSprop', 'SGD')}
    assert optims['Adam']['fused'] is True and 'fused' not in optims['RMSprop'] and 'fused' not in optims['SGD']
    spec = resumed(tmp_path, raw)
    assert 'fused' not in spec['agent']['net']['optim_spec']
    assert trial_spec(spec, {'agent.net.optim_spec.name': 'Adam'}, 3)['agent']['net']['optim_spec']['fused'] is True


def test_a_resumed_search_leaves_them_to_its_new_trials_and_an_older_search_keeps_its_own(tmp_path):
    """search@: this lab's search spec reads back without the keys (not as a spec saved before they
    existed: no clipping, per-tensor Adam), so the trials begun after the resume fill them as the
    ones before it; a search saved before this (its clipping filled from the base spec) continues
    with what it saved, as it started; a train run's saved spec that lacks a key predates it."""
    raw = ppo({'env.normalize_obs__choice': [True, False]})
    saved = load_run_spec(write(tmp_path, raw), NAME, 'search', None)
    assert 'clip_obs' not in fill_keys_added_later(copy.deepcopy(saved))['env']
    spec = resumed(tmp_path, raw)
    assert 'clip_obs' not in spec['env']
    assert trial_spec(spec, {'env.normalize_obs': True}, 3)['env']['clip_obs'] == 10.0
    older = copy.deepcopy(saved)
    older['env']['clip_obs'] = None  # as the lab saved it from the base's normalize_obs false
    spec = resumed(tmp_path, raw, older)
    assert spec['env']['clip_obs'] is None
    assert trial_spec(spec, {'env.normalize_obs': True}, 3)['env']['clip_obs'] is None
    train = {**saved, 'meta': {**saved['meta'], 'mode': 'train'}}
    assert fill_keys_added_later(copy.deepcopy(train))['env']['clip_obs'] is None
