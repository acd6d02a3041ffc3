"""What a fork or a warm start takes from its parent run, and how the new run records it: the
snapshot each session continues from (its newest intact one, or the one at a given frame), the
weights a warm start begins with (model_best.pt or the newest snapshot's nets), the check that
those weights fit the nets of the new spec, and the copies into the new run directory (the
snapshot, the CSV rows up to its frame, the warm-start weights). The parent is only read.
The modes themselves are in slm_lab/branch.py; docs/fork.md describes them."""
from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

from slm_lab.lib.errors import ResumeError
from slm_lab.lib.io import atomic_write_text
from slm_lab.persistence.model_file import contents_crc32, load_model_file, save_model_file
from slm_lab.persistence.run_dir import RunDir, is_search_run, read_pruned
from slm_lab.persistence.snapshot import STATE_FILE, list_snapshots, map_arrays, read_snapshot
from slm_lab.persistence.snapshots import load_latest_snapshot, problem_of
from slm_lab.persistence.snapshots import Snapshot


class LineageError(ResumeError):
    """A fork or warm start that cannot be made as asked (no such snapshot, weights that do not fit)."""


def snapshot_name(frame: int) -> str:
    """The directory name of a session's snapshot at `frame` (see persistence/snapshot.py)."""
    return f'f{frame:012d}'


def _frames(ckpt_dir: Path) -> list[int]:
    return sorted(int(p.name[1:]) for p in list_snapshots(ckpt_dir))


def fork_snapshots(parent: RunDir, sessions: int, frame: int | None) -> dict[int, Snapshot]:
    """The snapshot each of the first `sessions` sessions of `parent` continues from, loaded, its
    state file and its arrays checksummed (a full read: a fork copies what it finds, and its
    run directory is made only once every part is known intact): with `frame`, the snapshot at
    exactly that frame, which must be intact in every session; else each session's newest intact
    one, the damaged ones passed over on the way in its `passed_over` (the parent is only read:
    nothing of it is set aside). LineageError naming the session and the frames that exist
    otherwise."""
    loaded = {}
    for s in range(sessions):
        ckpt = parent.ckpt_dir(0, s)
        if frame is None:
            damaged: list = []
            found = load_latest_snapshot(ckpt, verify_arrays=True, damaged=damaged)
            if found is None:
                why = (f'all {len(damaged)} of its snapshots are damaged (newest {damaged[0][0].name}: '
                       f'{problem_of(*damaged[0])})' if damaged else f'it has no snapshot in {ckpt}')
                raise LineageError(f'--fork {parent.root}: session {s} has no intact snapshot: {why}; '
                                   'fork a run whose sessions all saved one')
            loaded[s] = found
            continue
        path = ckpt / snapshot_name(frame)
        frames = ', '.join(map(str, _frames(ckpt))) or 'none'
        if not path.is_dir():
            raise LineageError(f'--frame {frame}: session {s} of {parent.root} has no snapshot at frame {frame}; '
                               f'its snapshots are at frames: {frames}')
        try:
            plain, manifest = read_snapshot(path, verify_arrays=True)
        except ResumeError as e:
            raise LineageError(f'--frame {frame}: the snapshot of session {s} at that frame is damaged ({e}); '
                               f'its snapshots are at frames: {frames}') from None
        loaded[s] = Snapshot(map_arrays(plain, path, manifest['files']), manifest, path, plain)
    return loaded


def snapshot_record(run: RunDir, snapshot: Snapshot) -> dict:
    """How a lineage names a snapshot: its path in its run, frame, the CRC32 of its state file
    (from its manifest: it identifies the exact state continued from) and the digest of the spec
    it was saved under; and, when newer snapshots of the session were damaged, which ones were
    passed over to reach it and what was wrong with each (`passed_over`)."""
    manifest = snapshot.manifest
    record = {'snapshot': str(Path(snapshot.path).relative_to(run.root)), 'frame': manifest['frame'],
              'state_crc32': manifest['files'][STATE_FILE]['crc32'], 'spec_digest': manifest.get('spec_digest')}
    if snapshot.passed_over:
        record['passed_over'] = [{'snapshot': str(Path(path).relative_to(run.root)), 'problem': problem}
                                 for path, problem in snapshot.passed_over]
    return record


def warm_start_weights(parent: RunDir, session: int, ckpt: str, trial: int = 0) -> tuple[dict, dict]:
    """(nets {name: state_dict}, record for the lineage) of one session of trial `trial` of
    `parent`: `ckpt` 'best' is its model_best.pt (checksum verified), 'latest' its newest intact
    snapshot's nets."""
    search = is_search_run(parent.root)
    where = f'{parent.root}/t{trial}' if search else str(parent.root)
    pruned = read_pruned(parent) if search else {'removed': []}
    if trial in pruned['removed']:
        kept = pruned['kept']
        instead = (f'warm-start from a trial it kept: {", ".join(f"{parent.root}/t{i}" for i in kept)}' if kept else
                   'it kept no trial\'s weights (--keep 0): train that trial\'s spec again, '
                   f'{parent.spec_path(trial)}')
        raise LineageError(f'--warm-start {where}: the search\'s --keep removed the model files and snapshots of '
                           f'trial {trial}; {instead}')
    if ckpt == 'best':
        path = parent.model_path(trial, session, 'best')
        if not path.is_file():
            raise LineageError(f'--warm-start {where}: session {session} has no {path.name} (a session writes '
                               'it at its first evaluation); use --ckpt latest for its newest snapshot')
        state, _ = load_model_file(path)
        if not isinstance(state.get('nets'), dict):
            raise LineageError(f'{path} holds no nets; use --ckpt latest')
        return state['nets'], {'session': session, 'file': str(path.relative_to(parent.root)),
                               'frame': state.get('frame'), 'crc32': contents_crc32(state)}
    found = load_latest_snapshot(parent.ckpt_dir(trial, session), damaged=[])
    if found is None:
        raise LineageError(f'--warm-start {where} --ckpt latest: session {session} has no intact snapshot '
                           f'in {parent.ckpt_dir(trial, session)}; use --ckpt best')
    return found.nets, {'session': session, **snapshot_record(parent, found)}


def net_mismatches(saved: dict[str, dict], nets: dict) -> list[str]:
    """Why saved net weights (`saved`: {name: state_dict}) do not fit the nets a spec builds
    (`nets`: {name: torch module}); empty when every net's parameters have the saved shapes."""
    problems = []
    for name in sorted(set(nets) | set(saved)):
        if name not in saved:
            problems.append(f"net '{name}' is not in the saved weights")
            continue
        if name not in nets:
            problems.append(f"net '{name}' of the saved weights is not built by this spec")
            continue
        mine, theirs = nets[name].state_dict(), saved[name]
        for key in sorted(set(mine) | set(theirs)):
            a, b = tuple(getattr(theirs.get(key), 'shape', ())), tuple(getattr(mine.get(key), 'shape', ()))
            if key not in theirs or key not in mine:
                problems.append(f"net '{name}': {key} is {'missing from' if key not in theirs else 'extra in'} "
                                'the saved weights')
                break
            if a != b:
                problems.append(f"net '{name}': {key} is {list(a)} in the saved weights, {list(b)} under this spec")
                break
    return problems


def check_nets_fit(saved: dict[str, dict], nets: dict, source: str) -> None:
    """LineageError naming each net whose saved weights (from `source`) do not fit this spec."""
    problems = net_mismatches(saved, nets)
    if problems:
        raise LineageError(f'the weights of {source} do not fit the nets of this spec: {"; ".join(problems)}; '
                           'use the net shapes of the parent run (agent.net)')


def copy_snapshot(snapshot_dir: Path, ckpt_dir: Path) -> Path:
    """Copy a snapshot directory into a new run's ckpt dir. Files are hard-linked where the
    filesystem allows (a snapshot's files are never changed in place: each save writes a new
    directory, and snapshots already share unchanged replay chunks by hard links), else copied."""
    target = Path(ckpt_dir) / Path(snapshot_dir).name
    target.mkdir(parents=True)
    for src in Path(snapshot_dir).iterdir():
        try:
            os.link(src, target / src.name)
        except OSError:  # another filesystem, or links not allowed
            shutil.copy2(src, target / src.name)
    return target


def copy_rows(src: Path, dest: Path, frame: int) -> None:
    """Copy a session's CSV (train or eval rows), its lines as they are, keeping the rows up to
    `frame` (written atomically); no source, no copy. A row is one line (the lab's CSVs hold
    numbers and plain names)."""
    try:
        lines = src.read_text(encoding='utf-8').splitlines(keepends=True)
    except FileNotFoundError:
        return
    if not lines:
        return
    header = next(csv.reader([lines[0]]))
    if 'frame' not in header:
        return
    col = header.index('frame')
    try:
        kept = [lines[0]] + [line for line in lines[1:]
                             if line.strip() and float(next(csv.reader([line]))[col]) <= frame]
    except (ValueError, IndexError) as e:
        raise LineageError(f'{src}: a row has no readable frame ({e}); the CSV is damaged: fork from a run whose '
                           'records are intact') from None
    atomic_write_text(dest, ''.join(kept))


def write_warm_start(path: Path, nets: dict, record: dict) -> None:
    """The weights a warm-started session begins with (model/{prename}_warm_start.pt)."""
    save_model_file(path, {'nets': nets, 'lineage': record})


def load_warm_start(path: Path, nets: dict) -> None:
    """Load a warm start file's weights into `nets` ({name: torch module}), in place."""
    state, _ = load_model_file(path)
    for name, net in nets.items():
        net.load_state_dict(state['nets'][name])
