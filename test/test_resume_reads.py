"""A resume reads each snapshot once: the lab reads a session's newest snapshot to check it, and
a trial of one session continues with the state (and the session) that check loaded."""
from __future__ import annotations

import json
from pathlib import Path

from slm_lab import lab
from slm_lab.experiment import session as session_module
from slm_lab.persistence import snapshots as session_snapshots
from lab_helpers import PPO, assert_same_run, run_dirs, train_csv, write_spec


def test_train_at_latest_reads_the_snapshot_once_and_builds_one_session(tmp_path, monkeypatch):
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 1000
    spec_file = write_spec(tmp_path, 'once', spec)
    data_a, data_b = str(tmp_path / 'a'), str(tmp_path / 'b')
    lab.run(spec_file, 'once', 'train', data_dir=data_a)

    reads, built = [], []
    load_snapshot, init = session_snapshots.load_snapshot, session_module.Session.__init__

    def counted_load(path, *args, **kwargs):
        reads.append(Path(path).name)
        return load_snapshot(path, *args, **kwargs)

    def counted_init(self, *args, **kwargs):
        built.append(args[4] if len(args) > 4 else kwargs.get('session', 0))
        init(self, *args, **kwargs)
    monkeypatch.setattr(session_snapshots, 'load_snapshot', counted_load)
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
