"""meta.snapshot_replay left null (the default): the lab puts the replays into snapshots when they are
small next to the machine's memory and free disk (resources.decide_snapshot_replay), at the run's
start and at each resume, records its decision in the saved specs (meta.snapshot_replay_auto) and
says in one line when it leaves them out; an explicit true or false is obeyed; runs saved before
the default changed resume as they did."""
from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from lab_helpers import DQN, PPO, run_dirs, train_csv, write_spec

from slm_lab.agent.estimate import estimate_session, memory_needs
from slm_lab import lab, resources, runs
from slm_lab.persistence import edits
from slm_lab.persistence import snapshot as checkpoint
from slm_lab.spec import validate_spec

PLENTY = resources.MachineMemory(total=2**40, available=2**40)
CARTPOLE = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
ATARI = (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))


class LabLines:
    """The lab's log lines of INFO and above within a `with` block (its logger does not propagate
    to pytest's)."""

    def __enter__(self):
        self.records = []
        self.handler = logging.Handler(logging.INFO)
        self.handler.emit = self.records.append
        root = logging.getLogger('slm_lab')
        self.level = root.level
        root.setLevel(logging.INFO)  # as the command line sets it (lab.run too)
        root.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        root = logging.getLogger('slm_lab')
        root.removeHandler(self.handler)
        root.setLevel(self.level)

    def having(self, text: str) -> list[str]:
        return [r.getMessage() for r in self.records if text in r.getMessage()]


OFF_LINE = 'replays stay out of snapshots'


def dqn(**meta) -> dict:
    """lab_helpers.DQN with meta.snapshot_replay left out (the lab decides), meta updated."""
    spec = copy.deepcopy(DQN)
    del spec['meta']['snapshot_replay']
    spec['meta'].update(meta)
    return spec


def settled(raw: dict, spaces=CARTPOLE) -> tuple[dict, list]:
    """The validated spec and its estimate (estimate_session) on `spaces`."""
    spec = validate_spec(copy.deepcopy(raw), 'auto')
    return spec, estimate_session(spec, *spaces)


def replay_need(needs: list) -> resources.Need:
    (need,) = [n for n in needs if n.on_disk]
    return need


def test_a_small_replay_goes_into_snapshots(monkeypatch):
    monkeypatch.setattr(resources, 'free_disk', lambda path: 2**40)
    spec, needs = settled(dqn())
    assert spec['meta']['snapshot_replay'] is None  # the default: the lab decides
    need = replay_need(needs)
    with LabLines() as said:
        record = resources.decide_snapshot_replay(spec, needs, 'data', machine=PLENTY)
    assert record == {'on': True, 'memory_bytes': need.nbytes, 'memory_limit_bytes': 2**40 // 4,
                      'disk_bytes': need.on_disk, 'disk_limit_bytes': 2**40 // 4}
    assert not said.having(OFF_LINE)
    spec['meta']['snapshot_replay_auto'] = record
    assert resources.replay_in_snapshots(spec['meta'])


@pytest.mark.parametrize('over', ['memory', 'disk'])
def test_a_replay_above_a_quarter_of_memory_or_free_disk_stays_out_with_one_line(over, monkeypatch):
    """At the limit (1/4 of the memory available, 1/4 of the free disk) the replay goes in; one
    byte less room and it stays out, with one line naming its size, the limit and the key."""
    spec, needs = settled(dqn())
    need = replay_need(needs)
    for room, on in ((0, True), (-1, False)):
        memory = 4 * need.nbytes + room if over == 'memory' else 2**40
        disk = 4 * need.on_disk + room if over == 'disk' else 2**40
        monkeypatch.setattr(resources, 'free_disk', lambda path, disk=disk: disk)
        machine = resources.MachineMemory(total=2**40, available=memory)
        with LabLines() as said:
            record = resources.decide_snapshot_replay(spec, needs, 'data', machine=machine)
        assert record['on'] is on, (over, room, record)
        spec['meta']['snapshot_replay_auto'] = record
        assert resources.replay_in_snapshots(spec['meta']) is on
        lines = said.having(OFF_LINE)
        if on:
            assert not lines
            continue
        (line,) = lines
        size, limit = (need.nbytes, memory // 4) if over == 'memory' else (need.on_disk, disk // 4)
        assert resources.format_bytes(size) in line and resources.format_bytes(limit) in line, line
        assert f'1/4 of the {"memory available" if over == "memory" else "free disk"}' in line, line
        assert 'agent.memory.max_size' in line and 'meta.snapshot_replay: true' in line, line


@pytest.mark.parametrize('given', [True, False])
def test_an_explicit_value_is_obeyed_whatever_the_sizes(given, monkeypatch):
    spec, needs = settled(dqn(snapshot_replay=given))
    for disk in (0, 2**40):  # would be off, would be on
        monkeypatch.setattr(resources, 'free_disk', lambda path, disk=disk: disk)
        with LabLines() as said:
            assert resources.decide_snapshot_replay(spec, needs, 'data', machine=PLENTY) is None
        assert not said.having(OFF_LINE)
        spec['meta']['snapshot_replay_auto'] = {'on': not given}  # a stale decision does not count either
        assert resources.replay_in_snapshots(spec['meta']) is given


def test_no_replay_no_decision_and_an_unsettled_spec_keeps_replays_out():
    spec, needs = settled({**dqn(), 'agent': copy.deepcopy(PPO['agent'])})
    assert resources.decide_snapshot_replay(spec, needs, 'data', machine=PLENTY) is None
    assert resources.replay_in_snapshots(settled(dqn())[0]['meta']) is False  # built outside a run: as before


def test_the_estimate_counts_what_the_kept_snapshots_hold_on_disk():
    """Whole arrays: a full copy in each kept snapshot and the one being written; Atari frames:
    one copy, and each further snapshot only the chunks it rewrites; SIL's own replay counts."""
    spec, needs = settled(dqn(keep_checkpoints=3))
    need = replay_need(needs)
    assert need.on_disk == 4 * need.nbytes
    atari = dqn(checkpoint_frequency=10_000)
    atari['agent']['memory']['max_size'] = 100_000
    atari['env']['name'] = 'ALE/Pong-v5'
    spec, _ = settled(atari)
    (need,) = [n for n in memory_needs(spec, *ATARI, units=0) if n.on_disk]
    share = (10_000 + 2 * 4096) / 100_000  # keep_checkpoints 2: the first whole, two rewrite that share
    assert need.on_disk == round(need.nbytes * (1 + 2 * share))
    from conftest import build_spec
    sil = build_spec('SIL')
    spec, needs = settled(sil)
    (need,) = [n for n in needs if n.on_disk]
    assert need.what == 'SIL replay' and need.nbytes == 1000 * (2 * 16 + 8 + 8) and need.on_disk == 3 * need.nbytes


def test_a_search_counts_every_trial_on_disk():
    spec = validate_spec(dqn(max_trial=3), 'auto')
    spec['search'] = {'agent.net.optim_spec.lr__grid_search': [1e-3, 1e-2]}
    spec['meta']['mode'] = 'search'
    assert runs._trials_on_disk(spec) == 6
    spec['meta']['mode'] = 'train'
    assert runs._trials_on_disk(spec) == 1


def test_bytes_under_counts_a_hard_linked_file_once(tmp_path):
    (tmp_path / 'a').write_bytes(b'x' * 1000)
    os.link(tmp_path / 'a', tmp_path / 'b')
    (tmp_path / 'c').write_bytes(b'y' * 10)
    assert resources.bytes_under(tmp_path) == 1010
    assert resources.bytes_under(tmp_path / 'missing') == 0


def persisted(run: Path, name: str) -> list[bool]:
    """Whether each snapshot of session 0, oldest first, holds the replay's transitions."""
    out = []
    for snap in reversed(checkpoint.list_snapshots(run / 'ckpt' / f'{name}_t0_s0')):
        state, _ = checkpoint.load_snapshot(snap)
        out.append(state['agent']['memory']['persisted'])
    return out


def test_the_lab_decides_at_the_start_and_at_each_resume_and_the_saved_specs_say_so(tmp_path, monkeypatch, no_png):
    """A default DQN run puts its replay into snapshots and resumes exactly; resumed where the
    disk has no room, its resume is still exact (the snapshot holds the replay) and the lab says
    in one line that the replay stays out from then on, so the next resume is approximate."""
    name, data = 'auto', str(tmp_path / 'data')
    spec_file = write_spec(tmp_path, name, dqn(keep_checkpoints=5))
    lab.run(spec_file, name, 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), name)
    for path in (run / f'{name}_spec.json', run / f'{name}_t0_s0_spec.json'):
        meta = json.loads(path.read_text())['meta']
        assert meta['snapshot_replay'] is None and meta['snapshot_replay_auto']['on'] is True, meta
    monkeypatch.setattr(resources, 'free_disk', lambda path: 0)
    with LabLines() as said:
        lab.run(spec_file, name, 'train@latest', ['env.max_frame=1500'], data_dir=data)
    assert len(said.having(OFF_LINE)) == 1
    assert json.loads((run / f'{name}_t0_s0_spec.json').read_text())['meta']['snapshot_replay_auto']['on'] is False
    lab.run(spec_file, name, 'train@latest', ['env.max_frame=2000'], data_dir=data)
    records = json.loads((run / 'info' / f'{name}_t0_s0_resumes.json').read_text())
    assert [r['exact'] for r in records] == [True, False], records
    assert 'left out by the lab' in records[1]['approximate'][0]
    assert persisted(run, name) == [True, True, True, False, False]  # frames 0, 500, 1000 | 1500, 2000
    assert train_csv(run, name)['frame'].tolist() == [500, 1000, 1500, 2000]


def test_an_explicit_true_keeps_the_replay_in_where_the_lab_would_not(tmp_path, monkeypatch, no_png):
    monkeypatch.setattr(resources, 'free_disk', lambda path: 0)
    name, data = 'forced', str(tmp_path / 'data')
    spec_file = write_spec(tmp_path, name, dqn(snapshot_replay=True))
    with LabLines() as said:
        lab.run(spec_file, name, 'train', ['env.max_frame=500'], data_dir=data)
    assert not said.having(OFF_LINE)
    (run,) = run_dirs(Path(data), name)
    assert json.loads((run / f'{name}_t0_s0_spec.json').read_text())['meta']['snapshot_replay_auto'] is None
    assert all(persisted(run, name))


def test_keys_added_later_fill_a_missing_snapshot_replay_with_false():
    spec = {'meta': {}, 'env': {}, 'agent': {'algorithm': {'name': 'DQN'}}}
    assert edits.fill_keys_added_later(spec)['meta']['snapshot_replay'] is False
    spec = {'meta': {'snapshot_replay': None}, 'env': {}, 'agent': {'algorithm': {'name': 'DQN'}}}
    assert edits.fill_keys_added_later(spec)['meta']['snapshot_replay'] is None  # a run the lab decides for


@pytest.mark.parametrize('saved', ['false', 'absent'])
def test_a_run_saved_before_the_default_changed_resumes_as_it_did(saved, tmp_path, monkeypatch, no_png):
    """An older lab saved meta.snapshot_replay false (its default, filled in) or, older still, no
    such key; resumed with a spec file that leaves the key out, the run keeps its replay out of
    snapshots, with no decision of the lab, as it did."""
    monkeypatch.setattr(resources, 'free_disk', lambda path: 2**40)  # the lab would put it in
    name, data = 'old', str(tmp_path / 'data')
    spec_file = write_spec(tmp_path, name, dqn(snapshot_replay=False))
    lab.run(spec_file, name, 'train', ['env.max_frame=1000'], data_dir=data)
    (run,) = run_dirs(Path(data), name)
    for path in run.glob('*_spec.json'):  # as the older lab wrote them
        spec = json.loads(path.read_text())
        del spec['meta']['snapshot_replay_auto']
        if saved == 'absent':
            del spec['meta']['snapshot_replay']
        path.write_text(json.dumps(spec))
    spec_file = write_spec(tmp_path, name, dqn())
    lab.run(spec_file, name, 'train@latest', ['env.max_frame=1500'], data_dir=data)
    meta = json.loads((run / f'{name}_t0_s0_spec.json').read_text())['meta']
    assert meta['snapshot_replay'] is False and meta['snapshot_replay_auto'] is None, meta
    (record,) = json.loads((run / 'info' / f'{name}_t0_s0_resumes.json').read_text())
    assert record['exact'] is False
    assert not any(persisted(run, name))
