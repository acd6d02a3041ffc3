"""Fork (`train --fork RUN_DIR [--frame N]`) and warm start (`train --warm-start RUN_DIR
[--ckpt best|latest]`): new runs from a trained one, with their lineage, the parent untouched,
and every bad input one line before anything is written."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

import slm_lab
from lab_helpers import DQN, PPO, assert_same_run, cli, run_in_process, train_csv, tree_digest, write_spec, visible
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.persistence.model_file import load_model_file

NAME = 'fork_ppo'


def small_ppo(max_frame: int = 800) -> dict:
    spec = copy.deepcopy(PPO)
    spec['env']['max_frame'] = max_frame
    spec['meta'].update({'log_frequency': 100, 'eval_frequency': 200, 'keep_checkpoints': 100})
    return spec


@pytest.fixture(scope='module')
def parent(tmp_path_factory):
    """A PPO run of 800 frames with a snapshot every 100 frames, all kept: (spec file, data dir, run dir)."""
    root = tmp_path_factory.mktemp('parent')
    spec_file = write_spec(root, NAME, small_ppo())
    result = slm_lab.run(spec_file, NAME, 'train', data_dir=str(root / 'data'))
    return spec_file, root / 'data', result.run_dir


def snapshot_state(run: Path, frame: int, session: int = 0) -> dict:
    state, _ = checkpoint.load_snapshot(run / 'ckpt' / f'{NAME}_t0_s{session}' / f'f{frame:012d}')
    return state


def saved_spec(run: Path) -> dict:
    return json.loads((run / f'{NAME}_spec.json').read_text())


@pytest.mark.slow
def test_fork_at_f_run_to_2f_equals_the_parent(parent, tmp_path):
    """Forked at frame 400 with the parent's spec, run to 800: cell for cell the parent's run
    straight to 800; the parent is not changed (not even a lock file); the fork records its
    lineage, starts with the parent's rows up to 400, and is itself resumable with train@."""
    spec_file, data, parent_run = parent
    before = tree_digest(parent_run)
    names_before = sorted(p.name for p in parent_run.rglob('*'))
    out = tmp_path / 'data'
    result = slm_lab.run(spec_file, NAME, 'train', data_dir=str(out), fork=parent_run, frame=400)
    child = result.run_dir
    assert child.parent == out and child != parent_run
    assert_same_run(child, parent_run, NAME)
    assert tree_digest(parent_run) == before
    assert sorted(p.name for p in parent_run.rglob('*')) == names_before
    lineage = saved_spec(child)['meta']['lineage']
    manifest = json.loads((parent_run / 'ckpt' / f'{NAME}_t0_s0' / 'f000000000400' / 'MANIFEST.json').read_text())
    assert lineage['kind'] == 'fork' and lineage['frame'] == 400
    assert Path(lineage['parent']) == parent_run.resolve()
    assert lineage['sessions']['0'] == {'snapshot': f'ckpt/{NAME}_t0_s0/f000000000400', 'frame': 400,
                                        'state_crc32': manifest['files']['state.pt']['crc32'],
                                        'spec_digest': manifest['spec_digest']}
    # the fork continues: train@<its dir> to 1000, its lineage kept
    slm_lab.run(spec_file, NAME, f'train@{child}', ['env.max_frame=1000'], data_dir=str(out))
    assert train_csv(child, NAME)['frame'].iloc[-1] == 1000
    assert saved_spec(child)['meta']['lineage'] == lineage


@pytest.mark.slow
def test_fork_copies_the_parents_rows_up_to_its_frame(parent, tmp_path):
    """Before its first new row, a fork holds the parent's train and eval rows up to the frame
    (the spec edited: a new learning rate, which the saved state fits)."""
    spec_file, _, parent_run = parent
    out = tmp_path / 'data'
    result = slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=300', 'agent.net.optim_spec.lr=5e-4'],
                         data_dir=str(out), fork=parent_run, frame=200)
    child = result.run_dir
    for mode in ('train', 'eval'):
        mine, theirs = train_csv(child, NAME, mode), train_csv(parent_run, NAME, mode)
        head = theirs[theirs['frame'] <= 200]
        assert len(head) > 0
        assert mine.iloc[:len(head)].drop(columns=['wall_t', 'fps']).equals(head.drop(columns=['wall_t', 'fps']))
    assert train_csv(child, NAME)['frame'].iloc[-1] == 300
    assert saved_spec(child)['agent']['net']['optim_spec']['lr'] == 5e-4


@pytest.mark.slow
def test_fork_of_a_replay_run_is_exact(tmp_path):
    """DQN with its replay in the snapshot (array files, linked or copied into the fork): forked
    at F and run to 2F equals the run straight to 2F; the default frame is the newest snapshot."""
    spec = copy.deepcopy(DQN)
    spec['env']['max_frame'] = 600
    spec['meta'].update({'log_frequency': 200, 'eval_frequency': 200})
    spec_file = write_spec(tmp_path, 'fork_dqn', spec)
    parent = slm_lab.run(spec_file, 'fork_dqn', 'train', data_dir=str(tmp_path / 'a')).run_dir
    straight = slm_lab.run(spec_file, 'fork_dqn', 'train', ['env.max_frame=1200'],
                           data_dir=str(tmp_path / 'b')).run_dir
    before = tree_digest(parent)
    child = slm_lab.run(spec_file, 'fork_dqn', 'train', ['env.max_frame=1200'], data_dir=str(tmp_path / 'c'),
                        fork=parent).run_dir
    assert saved_spec_of(child, 'fork_dqn')['meta']['lineage']['sessions']['0']['frame'] == 600
    assert_same_run(child, straight, 'fork_dqn')
    assert tree_digest(parent) == before


def saved_spec_of(run: Path, name: str) -> dict:
    return json.loads((run / f'{name}_spec.json').read_text())


@pytest.mark.slow
@pytest.mark.parametrize('ckpt', ['best', 'latest'])
def test_warm_start_begins_at_frame_0_with_the_parents_weights(parent, tmp_path, ckpt):
    """The new run's first snapshot (frame 0) holds the parent's weights (model_best.pt, or the
    newest snapshot's nets) and no optimizer state; its rows start again from frame 0."""
    spec_file, _, parent_run = parent
    before = tree_digest(parent_run)
    out = tmp_path / 'data'
    child = slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=200'], data_dir=str(out), warm_start=parent_run,
                        ckpt=ckpt).run_dir
    if ckpt == 'best':
        expected = load_model_file(parent_run / 'model' / f'{NAME}_t0_s0_model_best.pt')[0]['nets']
    else:
        expected = snapshot_state(parent_run, 800)['agent']['algorithm']['nets']
    first = snapshot_state(child, 0)
    nets = first['agent']['algorithm']['nets']
    assert nets.keys() == expected.keys()
    for net in nets:
        for key in nets[net]:
            assert torch.equal(nets[net][key], expected[net][key]), f'{net}.{key}'
    assert all(not opt['state'] for opt in first['agent']['algorithm']['optimizers'].values())
    assert train_csv(child, NAME)['frame'].tolist() == [100, 200]
    lineage = saved_spec(child)['meta']['lineage']
    assert lineage['kind'] == 'warm_start' and lineage['ckpt'] == ckpt
    assert lineage['sessions']['0']['session'] == 0
    assert tree_digest(parent_run) == before


def _refused(args: list[str], cwd: Path, expect: str, capsys=None) -> str:
    """The command refused in one line, exit 2, nothing written: run as a process, or with `capsys`
    in this one (run_in_process, the same code after the interpreter's start: a process costs
    seconds, and the file's other refusals need no more than one of each kind)."""
    data = cwd / 'data'
    before = sorted(p.name for p in data.iterdir()) if data.exists() else []
    if capsys is None:
        proc = cli(args, cwd)
        code, stderr = proc.returncode, proc.stderr
    else:
        code, stderr = run_in_process(args, cwd, capsys)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), stderr
    assert expect in lines[0], lines[0]
    assert (sorted(p.name for p in data.iterdir()) if data.exists() else []) == before  # nothing written
    return lines[0]


@pytest.mark.slow
@pytest.mark.subprocess
def test_bad_fork_and_warm_start_input_is_one_line(parent, tmp_path, capsys):
    spec_file, _, parent_run = parent
    before = tree_digest(parent_run)
    run = str(parent_run)
    # no such run dir; a dir that is not a run of the spec; a search's dir
    _refused([spec_file, NAME, 'train', '--fork', str(tmp_path / 'nope')], tmp_path, 'no such run directory')
    (tmp_path / 'empty').mkdir()
    _refused([spec_file, NAME, 'train', '--warm-start', str(tmp_path / 'empty')], tmp_path,
             'is not a run directory', capsys)
    search = tmp_path / 'search_run'
    (search / 'search').mkdir(parents=True)
    (search / f'{NAME}_spec.json').write_text((parent_run / f'{NAME}_spec.json').read_text())
    _refused([spec_file, NAME, 'train', '--fork', str(search)], tmp_path, 'is a search', capsys)
    # a frame with no snapshot names the frames that exist
    line = _refused([spec_file, NAME, 'train', '--fork', run, '--frame', '250'], tmp_path, 'no snapshot at frame 250',
                    capsys)
    assert '100, 200, 300' in line and 'session 0' in line
    # the parent's newest snapshot is at its env.max_frame: a fork must train further
    _refused([spec_file, NAME, 'train', '--fork', run], tmp_path, 'use env.max_frame > 800', capsys)
    # nets that do not fit: named
    _refused([spec_file, NAME, 'train', '--fork', run, '-s', 'agent.net.hid_layers=[16]', '-s',
              'env.max_frame=1600'], tmp_path, "net 'model'")
    _refused([spec_file, NAME, 'train', '--warm-start', run, '-s', 'agent.net.hid_layers=[16]', '-s',
              'env.max_frame=1600'], tmp_path, "net 'model'", capsys)
    # usage mistakes, refused by the parser
    _refused([spec_file, NAME, 'dev', '--fork', run], tmp_path, 'use mode train')
    _refused([spec_file, NAME, 'train', '--fork', run, '--warm-start', run], tmp_path, '--fork and --warm-start',
             capsys)
    _refused([spec_file, NAME, 'train', '--frame', '400'], tmp_path, 'use it with --fork', capsys)
    assert tree_digest(parent_run) == before


def test_fork_options_parse_alike_in_both_spellings():
    from slm_lab.cli import parse_run_args
    for prog in ('run_lab.py', 'slm-lab run'):
        args = parse_run_args(['s.json', 'x', 'train', '--fork', 'data/x_1', '--frame', '400'], prog)
        assert (args.fork, args.frame, args.warm_start) == ('data/x_1', 400, None)
        args = parse_run_args(['s.json', 'x', 'train', '--warm-start', 'data/x_1', '--ckpt', 'latest'], prog)
        assert (args.warm_start, args.ckpt) == ('data/x_1', 'latest')


def test_fork_api_checks(tmp_path):
    """The Python API refuses what the command line refuses, as ModeError, before reading anything."""
    from slm_lab.lib.errors import ModeError
    spec_file = write_spec(tmp_path, NAME, small_ppo())
    for kwargs, expect in (({'fork': 'a', 'warm_start': 'b'}, '--fork and --warm-start'),
                           ({'frame': 100}, '--frame'), ({'fork': 'a', 'ckpt': 'best'}, '--ckpt')):
        with pytest.raises(ModeError, match=expect):
            slm_lab.run(spec_file, NAME, 'train', data_dir=str(tmp_path / 'data'), **kwargs)
    with pytest.raises(ModeError, match='use mode train'):
        slm_lab.run(spec_file, NAME, 'dev', data_dir=str(tmp_path / 'data'), fork='a')
    assert not (tmp_path / 'data').exists()


@pytest.mark.slow
def test_fork_of_two_sessions_is_exact_for_each(tmp_path):
    """Each session of a two-session run (run in their own processes) continues from its own
    snapshot: forked at 200 and run to 400, both sessions equal the parent's."""
    spec = small_ppo(400)
    spec['meta']['max_session'] = 2
    spec_file = write_spec(tmp_path, NAME, spec)
    parent_run = slm_lab.run(spec_file, NAME, 'train', data_dir=str(tmp_path / 'a')).run_dir
    child = slm_lab.run(spec_file, NAME, 'train', data_dir=str(tmp_path / 'b'), fork=parent_run, frame=200).run_dir
    for s in (0, 1):
        for mode in ('train', 'eval'):
            path = Path('info') / f'{NAME}_t0_s{s}_session_df_{mode}.csv'
            mine, theirs = (pd.read_csv(run / path).drop(columns=['wall_t', 'fps']) for run in (child, parent_run))
            pd.testing.assert_frame_equal(mine, theirs)
        for net, weights in snapshot_state(parent_run, 400, s)['agent']['algorithm']['nets'].items():
            forked = snapshot_state(child, 400, s)['agent']['algorithm']['nets'][net]
            assert all(torch.equal(weights[k], forked[k]) for k in weights), f'session {s} {net}'


# --- damaged parents (issue 27) ------------------------------------------------------------------

def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize('damage', ['state.pt', 'MANIFEST.json'])
def test_a_fork_passes_over_a_damaged_newest_snapshot_and_says_so(parent, tmp_path, damage, no_png):
    """Without --frame, a fork takes each session's newest intact snapshot: it says which of the
    parent's snapshots it skipped and why, records it in its lineage, and leaves the parent as it
    is (nothing set aside there)."""
    from conftest import LabWarnings
    spec_file, _, template = parent
    data = tmp_path / 'data'
    parent_run = Path(shutil.copytree(template, data / template.name))
    newest = parent_run / 'ckpt' / f'{NAME}_t0_s0' / 'f000000000800'
    if damage == 'state.pt':
        flip_byte(newest / 'state.pt')
    else:
        (newest / 'MANIFEST.json').unlink()
    said = 'state.pt fails its checksum' if damage == 'state.pt' else 'manifest missing'
    before = tree_digest(parent_run)
    with LabWarnings() as warned:
        child = slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=900'], data_dir=str(data),
                            fork=parent_run).run_dir
    assert (f'--fork {parent_run}: session 0: skipped damaged snapshot f000000000800 ({said}' in warned.text
            and 'taking f000000000700 (frame 700)' in warned.text), warned.text
    session = saved_spec(child)['meta']['lineage']['sessions']['0']
    assert session['frame'] == 700
    (skipped,) = session['passed_over']
    assert skipped['snapshot'] == f'ckpt/{NAME}_t0_s0/f000000000800' and said in skipped['problem']
    assert train_csv(child, NAME)['frame'].iloc[-1] == 900
    assert tree_digest(parent_run) == before and newest.is_dir()


def test_a_fork_takes_the_older_snapshot_when_the_newest_replay_arrays_are_damaged(tmp_path, monkeypatch, no_png):
    """Before: the fork took the newest snapshot (its arrays are checked by size only at load),
    found their damage once its directory existed, stopped with 'no older intact snapshot is
    left' and left that directory behind for train@latest to fail on. Now the arrays are checked
    before the fork's directory is made, and the parent's older intact snapshot is taken."""
    from conftest import LabWarnings
    monkeypatch.setattr(checkpoint, 'ARRAY_FILE_MIN_BYTES', 1024)  # so this small replay gets .npy files
    spec = copy.deepcopy(DQN)
    spec['env']['max_frame'] = 1000
    spec['meta'].update({'log_frequency': 500, 'eval_frequency': 500})
    spec_file = write_spec(tmp_path, 'fork_replay', spec)
    data = tmp_path / 'data'
    parent_run = slm_lab.run(spec_file, 'fork_replay', 'train', data_dir=str(data)).run_dir
    newest = checkpoint.list_snapshots(parent_run / 'ckpt' / 'fork_replay_t0_s0')[0]
    array = newest / 'agent.memory.states.npy'
    assert newest.name == 'f000000001000' and array.is_file()
    flip_byte(array, offset=array.stat().st_size - 8)  # in the data, past the .npy header
    before = tree_digest(parent_run)
    with LabWarnings() as warned:
        child = slm_lab.run(spec_file, 'fork_replay', 'train', ['env.max_frame=1500'], data_dir=str(data),
                            fork=parent_run).run_dir
    assert 'skipped damaged snapshot f000000001000 (agent.memory.states.npy fails its checksum' in warned.text
    lineage = saved_spec_of(child, 'fork_replay')['meta']['lineage']
    assert lineage['sessions']['0']['frame'] == 500 and lineage['sessions']['0']['passed_over']
    assert train_csv(child, 'fork_replay')['frame'].tolist() == [500, 1000, 1500]
    assert tree_digest(parent_run) == before
    # the fork is the newest run: train@latest continues it
    slm_lab.run(spec_file, 'fork_replay', 'train@latest', ['env.max_frame=2000'], data_dir=str(data))
    assert train_csv(child, 'fork_replay')['frame'].iloc[-1] == 2000
    assert tree_digest(parent_run) == before


def test_a_fork_that_fails_before_it_trains_leaves_no_directory(parent, tmp_path, monkeypatch, no_png):
    """Its new directory goes (the parent's stays as it was), so train@latest never takes it."""
    from slm_lab.experiment.session import Session
    spec_file, _, template = parent
    data = tmp_path / 'data'
    parent_run = Path(shutil.copytree(template, data / template.name))
    before = tree_digest(parent_run)

    def fails(self, *args, **kwargs):
        raise RuntimeError('failed while loading')
    monkeypatch.setattr(Session, 'resume_from', fails)
    with pytest.raises(RuntimeError, match='failed while loading'):
        slm_lab.run(spec_file, NAME, 'train', ['env.max_frame=900'], data_dir=str(data), fork=parent_run)
    assert [p.name for p in visible(data)] == [parent_run.name]
    assert tree_digest(parent_run) == before


@pytest.mark.parametrize('prog', ['run_lab.py', 'slm-lab run'])
def test_ckpt_with_a_fork_says_it_goes_with_warm_start_or_enjoy(prog, capsys):
    """Before: '--ckpt only apply to enjoy@', though --warm-start takes it too."""
    from slm_lab.cli import parse_run_args
    with pytest.raises(SystemExit) as info:
        parse_run_args(['s.json', 'x', 'train', '--fork', 'data/x_1', '--ckpt', 'best'], prog)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert '--ckpt picks the weights that --warm-start RUN_DIR or enjoy@<session spec> load' in line, line
    assert 'not with --fork; a fork continues from a snapshot: pick it with --frame N' in line, line


def test_a_fork_under_another_algorithm_says_so_in_one_line(parent, tmp_path):
    """Before: a DQN spec named as the PPO parent failed on a key of PPO's (agent.algorithm.lam:
    unknown key). Now the line names both algorithms and the way on (--warm-start); train@ of
    such a spec says the same of the run."""
    from slm_lab.lib.errors import ResumeError
    spec_file, _, template = parent
    dqn_file = write_spec(tmp_path, NAME, DQN)  # a DQN spec under the PPO parent's name
    data = tmp_path / 'data'
    with pytest.raises(ResumeError) as info:
        slm_lab.run(dqn_file, NAME, 'train', ['env.max_frame=1600'], data_dir=str(data), fork=template)
    line = str(info.value)
    assert line.startswith("--fork: the parent run's algorithm is PPO and the spec's is DQN; a fork continues the "
                           "parent's training, so it needs the same algorithm"), line
    assert 'use --warm-start instead of --fork' in line and '\n' not in line and 'lam' not in line, line
    assert not data.exists()
    parent_run = Path(shutil.copytree(template, data / template.name))
    before = tree_digest(parent_run)
    with pytest.raises(ResumeError) as info:
        slm_lab.run(dqn_file, NAME, f'train@{parent_run}', ['env.max_frame=1600'], data_dir=str(data))
    line = str(info.value)
    assert line.startswith("the run's algorithm is PPO and the spec's is DQN"), line
    assert f'train@{parent_run} continues a run with its own algorithm: use a spec of PPO' in line, line
    assert tree_digest(parent_run) == before and [p.name for p in visible(data)] == [parent_run.name]


@pytest.mark.slow
def test_a_fork_says_where_it_moves_a_schedule(tmp_path, capsys, no_png):
    """As train@ does: a fork whose spec moves a frame-driven schedule (a new lr under
    LinearToZero) says it in one warning line and records it in its lineage (the fork by the
    command line's code in this process, run_in_process)."""
    spec = small_ppo(400)
    spec['agent']['net']['lr_scheduler_spec'] = {'name': 'LinearToZero'}
    spec_file = write_spec(tmp_path, NAME, spec)
    parent = slm_lab.run(spec_file, NAME, 'train', data_dir=str(tmp_path / 'data')).run_dir
    code, err = run_in_process([spec_file, NAME, 'train', '--fork', str(parent), '-s', 'env.max_frame=800', '-s',
                                'agent.net.optim_spec.lr=1e-4'], tmp_path, capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if 'schedule change on fork' in line]
    assert len(lines) == 1 and 'lr' in lines[0] and '->' in lines[0], err
    (child,) = [p for p in (tmp_path / 'data').iterdir() if p.name.startswith(NAME) and p != parent]
    assert saved_spec(child)['meta']['lineage']['schedule_changes'][0]['key'].endswith('lr')
