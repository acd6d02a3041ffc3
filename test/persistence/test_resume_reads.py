"""A resume reads each snapshot once: the lab reads a session's newest snapshot to check it, and
a trial of one session continues with the state (and the session) that check loaded; the sessions
of a trial of several, each in its own process, continue from what the lab read and sent them."""
from __future__ import annotations

import json
import os
import textwrap
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from slm_lab import lab
from slm_lab.experiment import session as session_module
from slm_lab.persistence import snapshots as session_snapshots
from lab_helpers import DQN, PPO, assert_same_run, cli, lab_env, run_dirs, train_csv, write_spec


def test_train_at_latest_reads_the_snapshot_once_and_builds_one_session(tmp_path, monkeypatch):
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 1000
    spec_file = write_spec(tmp_path, 'once', spec)
    data_a, data_b = str(tmp_path / 'a'), str(tmp_path / 'b')
    lab.run(spec_file, 'once', 'train', data_dir=data_a)

    reads, built = [], []
    read_snapshot, init = session_snapshots.read_snapshot, session_module.Session.__init__

    def counted_read(path, *args, **kwargs):
        reads.append(Path(path).name)
        return read_snapshot(path, *args, **kwargs)

    def counted_init(self, *args, **kwargs):
        built.append(args[4] if len(args) > 4 else kwargs.get('session', 0))
        init(self, *args, **kwargs)
    monkeypatch.setattr(session_snapshots, 'read_snapshot', counted_read)
    monkeypatch.setattr(session_module.Session, '__init__', counted_init)
    lab.run(spec_file, 'once', 'train@latest', ['env.max_frame=2000'], data_dir=data_a)
    monkeypatch.undo()

    assert reads == ['f000000001000'], 'the snapshot is read exactly once'
    assert len(built) == 1, 'the session that checked the snapshot is the one that continues'
    (run_a,) = run_dirs(Path(data_a), 'once')
    assert train_csv(run_a, 'once')['frame'].iloc[-1] == 2000
    records = json.loads((run_a / 'info' / 'once_t0_s0_resumes.json').read_text())
    assert [r['frame'] for r in records] == [1000] and records[0]['exact']
    # and the continuation is still exact: the same as one uninterrupted run
    lab.run(spec_file, 'once', 'train', ['env.max_frame=2000'], data_dir=data_b)
    (run_b,) = run_dirs(Path(data_b), 'once')
    assert_same_run(run_a, run_b, 'once')


# Loaded first by every Python process whose PYTHONPATH holds it (the lab and each session it
# spawns): an audit hook that notes each opening of a state.pt by read_snapshot, the one reader of
# a snapshot's state, in the file named by READ_LOG.
COUNTING_SITECUSTOMIZE = textwrap.dedent("""
    import os, sys
    LOG = os.environ.get('READ_LOG')

    def hook(event, args):
        if event != 'open' or not LOG or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(args[0])
        if not path.endswith('state.pt'):
            return
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == 'read_snapshot':
                fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.write(fd, f'{os.getpid()} {path}\\n'.encode())
                os.close(fd)
                return
            frame = frame.f_back

    sys.addaudithook(hook)
""")


@pytest.mark.slow
@pytest.mark.subprocess
def test_sessions_in_their_own_processes_continue_from_what_the_lab_read(tmp_path, no_png):
    """Two sessions, each in its own process, with replays in their snapshots: train@latest reads
    each session's snapshot once in all (in the lab, which checks it), and each session continues
    from it exactly."""
    spec = json.loads(json.dumps(DQN))
    spec['env']['max_frame'] = 600
    spec['meta'].update(max_session=2, log_frequency=200, eval_frequency=600)
    spec_file = write_spec(tmp_path, 'twice', spec)
    hooks = tmp_path / 'hooks'
    hooks.mkdir()
    (hooks / 'sitecustomize.py').write_text(COUNTING_SITECUSTOMIZE)
    log = tmp_path / 'reads.log'
    env = {**lab_env(), 'PYTHONPATH': os.pathsep.join([str(hooks)] + [p for p in [os.environ.get('PYTHONPATH')] if p]),
           'READ_LOG': str(log)}
    done = cli([spec_file, 'twice', 'train'], tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not log.exists(), 'a fresh run reads no snapshot'
    done = cli([spec_file, 'twice', 'train@latest', '-s', 'env.max_frame=1200'], tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]

    reads = [line.split(' ', 1) for line in log.read_text().splitlines()]
    per_snapshot = Counter('/'.join(Path(path).parts[-3:-1]) for _, path in reads)
    assert per_snapshot == {'twice_t0_s0/f000000000600': 1, 'twice_t0_s1/f000000000600': 1}, per_snapshot
    lab_pid = {pid for pid, _ in reads}
    assert len(lab_pid) == 1, 'the lab read both; the sessions read none'
    (run,) = run_dirs(tmp_path / 'data', 'twice')
    # the run that never stopped, for the comparison: the lab in this process, its sessions in theirs
    straight_dir = tmp_path / 'straight'
    lab.run(spec_file, 'twice', 'train', ['env.max_frame=1200'], data_dir=str(straight_dir / 'data'))
    (straight,) = run_dirs(straight_dir / 'data', 'twice')
    for s in (0, 1):
        records = json.loads((run / 'info' / f'twice_t0_s{s}_resumes.json').read_text())
        assert [r['frame'] for r in records] == [600] and records[0]['exact']
        csv = f'info/twice_t0_s{s}_session_df_train.csv'
        resumed, whole = pd.read_csv(run / csv), pd.read_csv(straight / csv)
        assert resumed['frame'].iloc[-1] == 1200
        pd.testing.assert_frame_equal(resumed.drop(columns=['wall_t', 'fps']), whole.drop(columns=['wall_t', 'fps']))
