"""Weights & Biases tracking (meta.wandb, --track), with the real wandb package offline: one W&B run
per session, which a resumed run continues (one id, the history continuous, each frame once), the
spec as its config; and the spec key, the flag, the mode and the missing-package error."""
from __future__ import annotations

import copy
import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lab_helpers import PPO, RUN_LAB, cli, lab_env, run_dirs, write_spec
from slm_lab import lab
from slm_lab.cli import parse_run_args
from slm_lab.experiment.scalars import SHOWN_COLUMNS
from slm_lab.experiment.wandb_board import wandb_mode
from slm_lab.lib.errors import ResumeError, SpecError
from slm_lab.persistence.edits import check_edits
from slm_lab.spec import load_spec

pytestmark = pytest.mark.skipif(importlib.util.find_spec('wandb') is None,
                                reason="the wandb extra is not installed (pip install '.[wandb]')")


def test_meta_wandb_is_off_by_default_and_its_values_are_checked(spec_file, make_spec):
    spec = make_spec('PPO')
    assert load_spec(spec_file({'a': spec}), 'a')['meta']['wandb'] is False
    for value in (True, {'project': 'cartpole', 'entity': 'lab', 'mode': 'offline', 'group': 'g', 'tags': ['ppo']}):
        spec['meta']['wandb'] = value
        assert load_spec(spec_file({'a': spec}), 'a')['meta']['wandb'] == value
    for value, named in (({'projct': 'x'}, "meta.wandb.projct: unknown key (did you mean 'project'?)"),
                         ({'mode': 'cloud'}, 'meta.wandb.mode'), ({'tags': 'ppo'}, 'meta.wandb.tags'),
                         ('yes', 'meta.wandb'), (1, 'meta.wandb')):
        spec['meta']['wandb'] = value
        with pytest.raises(SpecError) as info:
            load_spec(spec_file({'a': spec}), 'a')
        assert named in str(info.value) and '\n' not in str(info.value), str(info.value)


def test_a_missing_wandb_package_is_one_line_before_anything_is_written(tmp_path, monkeypatch, spec_file, make_spec):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'wandb' else find_spec(name, *a))
    spec = make_spec('PPO', wandb={'project': 'p'})
    with pytest.raises(SpecError) as info:
        lab.run(spec_file({'w': spec}), 'w', 'train', data_dir=str(tmp_path / 'data'))
    assert "pip install '.[wandb]'" in str(info.value) and '\n' not in str(info.value)
    assert not (tmp_path / 'data').exists()


def test_track_turns_wandb_on_as_an_override_the_run_records(capsys):
    args = parse_run_args(['spec.json', 'ppo', 'train', '-s', 'env.max_frame=500', '--track'])
    assert args.overrides == ['env.max_frame=500', 'meta.wandb=true']
    assert parse_run_args(['spec.json', 'ppo', 'train']).overrides == []
    with pytest.raises(SystemExit) as info:
        parse_run_args(['enjoy@data/run/ppo_t0_s0_spec.json', '--track'])
    assert info.value.code == 2 and '--track does not apply to enjoy@' in capsys.readouterr().err


def test_the_mode_honours_wandb_mode_and_is_offline_without_an_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv('WANDB_MODE', raising=False)
    monkeypatch.delenv('WANDB_API_KEY', raising=False)
    monkeypatch.delenv('WANDB_IDENTITY_TOKEN_FILE', raising=False)
    monkeypatch.setenv('NETRC', str(tmp_path / 'netrc'))
    no_key = SimpleNamespace(api_key=None, base_url='https://api.wandb.ai', mode='online')
    mode, why = wandb_mode(None, no_key)
    assert mode == 'offline' and 'no API key' in why
    assert wandb_mode('online', no_key)[0] == 'offline'
    (tmp_path / 'netrc').write_text('machine api.wandb.ai login user password secret\n')
    assert wandb_mode(None, no_key) == ('online', None)  # what `wandb login` writes
    assert wandb_mode('offline', no_key) == ('offline', None)
    monkeypatch.setenv('WANDB_MODE', 'offline')
    assert wandb_mode('online', SimpleNamespace(api_key='k' * 40, base_url='https://api.wandb.ai', mode='online')) \
        == ('offline', None)
    monkeypatch.setenv('WANDB_MODE', 'disabled')
    assert wandb_mode(None, no_key) == ('disabled', None)


def test_a_resume_may_turn_wandb_on_or_change_its_settings(spec_file, make_spec):
    spec = make_spec('PPO', random_seed=3)
    old = load_spec(spec_file({'a': spec}), 'a')
    for value in (True, {'project': 'p'}):
        spec['meta']['wandb'] = value
        new = load_spec(spec_file({'a': spec}), 'a')
        assert ('meta.wandb', False, value) in check_edits(old, new, force=False)
    spec['meta']['wandb'] = {'project': 'q', 'tags': ['x']}
    newer = load_spec(spec_file({'a': spec}), 'a')
    assert {d[0] for d in check_edits(new, newer, force=False)} == {'meta.wandb.project', 'meta.wandb.tags'}
    spec['meta']['log_frequency'] = 7
    spec['agent']['algorithm']['gamma'] = 0.5
    with pytest.raises(ResumeError):  # the check still refuses what breaks continuity
        check_edits(new, load_spec(spec_file({'a': spec}), 'a'), force=False)


def wandb_env(tmp_path: Path) -> dict:
    """W&B offline with every file of its own in tmp_path and no credentials: nothing leaves the
    machine or lands in the home directory or /tmp (each W&B process leaves two empty temporary
    directories behind)."""
    env = {k: v for k, v in lab_env().items() if not k.startswith('WANDB_')}
    (tmp_path / 'tmp').mkdir()
    return {**env, 'WANDB_MODE': 'offline', 'WANDB_DIR': str(tmp_path / 'wandb_dir'),
            'WANDB_CONFIG_DIR': str(tmp_path / 'wandb_config'), 'WANDB_CACHE_DIR': str(tmp_path / 'wandb_cache'),
            'WANDB_DATA_DIR': str(tmp_path / 'wandb_data'), 'NETRC': str(tmp_path / 'no_netrc'),
            'TMPDIR': str(tmp_path / 'tmp')}


def without_empty_objects(value):
    """`value` with its empty objects left out, as W&B stores a config (env.make_kwargs {} is not in it)."""
    if isinstance(value, dict):
        return {k: without_empty_objects(v) for k, v in value.items() if not (isinstance(v, dict) and not v)}
    return value


def wandb_history(run_path: Path, env: dict) -> list[dict]:
    """The history rows of one offline W&B run directory, read with W&B's own reader of its files."""
    done = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json', str(run_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{')]
    return [r['history']['item'] for r in records if r.get('type') == 'history']


def wandb_summary(run_path: Path, env: dict) -> dict:
    done = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--summary', '--json', str(run_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_stopped_by_sigterm_and_resumed_is_one_wandb_run_with_each_frame_once(tmp_path):
    """`--track`, SIGTERM a few rows in, then a bare train@latest: the resumed session continues
    the same W&B run (its id kept in info/), whose offline files hold every record row once, in
    frame order, with the CSVs' values, and the session's spec as its config."""
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = 400000
    spec['meta'].update(log_frequency=100, eval_frequency=200)
    name, env = 'wbterm', wandb_env(tmp_path)
    spec_file = write_spec(tmp_path, name, spec)
    proc = subprocess.Popen([sys.executable, RUN_LAB, spec_file, name, 'train', '--track'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # W&B started (at the first log point) and a few rows logged
            runs = run_dirs(tmp_path / 'data', name)
            csv = runs[0] / 'info' / f'{name}_t0_s0_session_df_train.csv' if runs else None
            if csv is not None and list((runs[0] / 'wandb').glob('offline-run-*')) and csv.exists() \
                    and len(pd.read_csv(csv)) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, proc.stderr.read()
    (run,) = run_dirs(tmp_path / 'data', name)
    stop = pd.read_csv(run / 'info' / f'{name}_t0_s0_session_df_train.csv')['frame'].iloc[-1]
    end = (stop // 100 + 3) * 100
    done = cli([spec_file, name, 'train@latest', '-s', f'env.max_frame={end}'], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads((run / 'info' / f'{name}_t0_s0_wandb.json').read_text())['id']
    segments = sorted((run / 'wandb').glob('offline-run-*'))
    assert len(segments) == 2 and all(p.name.endswith(f'-{run_id}') for p in segments), segments
    # the history: each record row once, in frame order, across the two offline run directories
    dfs = {kind: pd.read_csv(run / 'info' / f'{name}_t0_s0_session_df_{kind}.csv') for kind in ('train', 'eval')}
    assert dfs['train']['frame'].tolist() == list(range(100, end + 1, 100))
    history = [row for segment in segments for row in wandb_history(segment, env)]
    steps = [row['_step'] for row in history]
    assert steps == sorted(set(dfs['train']['frame']) | set(dfs['eval']['frame'])), steps
    by_step = {row['_step']: row for row in history}
    for kind, df in dfs.items():
        for row in df.to_dict('records'):
            logged = by_step[row['frame']]
            for column in SHOWN_COLUMNS[kind]:
                if row[column] == row[column]:  # not an empty cell
                    assert logged[f'{kind}/{column}'] == pytest.approx(row[column]), (kind, column, row['frame'])
                else:
                    assert f'{kind}/{column}' not in logged
    # the config is the session's spec as the run saved it, --track recorded in it
    saved = json.loads((run / f'{name}_t0_s0_spec.json').read_text())
    assert saved['meta']['wandb'] is True and 'meta.wandb=true' in saved['meta']['overrides']
    summary = wandb_summary(segments[-1], env)
    assert summary['run_id'] == run_id and summary['name'] == f'{name}_t0_s0'
    config = {k: v for k, v in summary['config'].items() if k != '_wandb'}
    assert config == without_empty_objects(saved)
    assert not (tmp_path / 'wandb_dir').exists() or not any((tmp_path / 'wandb_dir').rglob('*.wandb'))
