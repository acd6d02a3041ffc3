"""Measure how fast snapshots are written and read back, and what they cost in memory.

    python bench/checkpoint.py            # everything: ~2 GB replay, 3 repetitions (~11 minutes)
    python bench/checkpoint.py --quick    # 10x smaller replays and 1 repetition (~1 minute)
    python bench/checkpoint.py --parts verify --reps 3   # the background checksum alone (~0.3 GB)

Four parts (--parts picks some of them):

  sessions  A real PPO CartPole session (spec/demo.json ppo_cartpole) and a DQN CartPole session
            (spec/benchmark/dqn/dqn_cartpole_zoo.json, with and without meta.snapshot_replay) are
            trained for a few thousand frames; then `checkpoint.save_snapshot` of
            `session.state_dict()` and `checkpoint.load_snapshot` are timed (page cache warm: the
            snapshot was just written). Snapshot size is what the directory holds on disk.
  replay    A `Replay` of --replay-size transitions (100,000 by default) with 10 KB float32
            observations (shape (2560,)), persist=True, filled with random data. The Replay keeps
            states AND next_states, so it holds twice the observations (~2 GB). Each phase runs in
            a fresh subprocess, which reads VmRSS / VmHWM from /proc/self/status (the peak is reset
            with /proc/self/clear_refs just before the phase) to give the peak memory beyond the
            buffer itself:
              save           checkpoint.save_snapshot({'memory': replay.state_dict()}), fsync included
              load           load_snapshot + replay.load_state_dict + one replay.sample(): time to
                             the first sample; then every array is read in full (a sum) for GB/s
              sample         the mean time of the first 100 samples after a cold load, against
                             100 samples from the filled replay in RAM
              pickle save    pickle.dump of replay.state_dict() to one file + fsync (protocol 4,
                             Python's default, and 5, the highest, which Stable-Baselines3 uses)
              pickle load    pickle.load of that file (a full copy in memory), then one sample
              disk           the raw sequential speed of the same disk for the same byte count:
                             f.write of a preallocated buffer in 64 MiB chunks + fsync, and
                             f.readinto in 64 MiB chunks
            Every write is timed twice in its process: first, then again at once after deleting
            the file. On a VM that hands freed memory back to its host, the first write pays for
            fresh page-cache pages and the repeat does not; the order of the methods rotates.
            Before every read the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`, root
            only; else posix_fadvise(DONTNEED) on the files), and mincore(2) tells how much of the
            files was still cached: the table says cold or warm.
  resume    `python run_lab.py spec/demo.json ppo_cartpole train -s env.max_frame=2000` in a
            temporary working directory, then `... train@latest -s env.max_frame=2008` (one more
            vector step of 8 envs) timed end to end in a subprocess, with the moment its output
            reports the first resumed step; also the in-process `load_s` that the run records in
            info/*_resumes.json. For reference, a bare `python -c "import torch, gymnasium,
            pandas, plotly"`: the end-to-end time includes Python start-up and imports.
  verify    What checking a resumed snapshot's array checksums costs the first training steps. A
            replay snapshot of --verify-size transitions (15,000 by default: ~0.3 GB of arrays) is
            saved once; then, in a fresh subprocess each, with the page cache dropped: load_snapshot
            + Replay.load_state_dict, then --steps steps (500; a step is replay.sample() and one Adam
            update of a 2560-64-4 MLP), timed to steps 1, 100 and the last, with the checksums
              none        not checked (sizes only: what a resume did before)
              background  checked by checkpoint.verify_arrays_async while the steps run; also the
                          time the check took and how long a save after the last step would wait
              upfront     checked before the first step (load_snapshot(verify_arrays=True))

All files go to a temporary directory under data/ (same disk as the repository), deleted at the
end. Each figure is measured --reps times (3; 1 with --quick); the table gives the best and the
median. GB means 10^9 bytes.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

OBS_DIM = 2560  # float32: 10,240 bytes per observation
FULL_REPLAY_SIZE = 100_000
VERIFY_REPLAY_SIZE = 15_000  # ~0.3 GB of arrays: the verify part's replay
CHUNK = 64 << 20  # raw disk test: bytes per write/read call
FILL_CHUNK = 1000  # transitions per Replay.add while filling
SAMPLES = 100  # batches timed for the mean time of one replay.sample()
BENCH_SPEC = {'bench': 'checkpoint'}  # save_snapshot only needs a spec to digest
PHASE_TIMEOUT_S = 900


# --- process memory and page cache --------------------------------------------------------------

def proc_status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in bytes."""
    out = {}
    with open('/proc/self/status') as f:
        for line in f:
            key, _, value = line.partition(':')
            if key in ('VmRSS', 'VmHWM', 'RssAnon', 'RssFile'):
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Set VmHWM back to the current RSS (Linux >= 4.0); False where not permitted."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


_libc = ctypes.CDLL(None, use_errno=True)


def resident_fraction(paths: list[Path]) -> float:
    """Fraction of the files' pages that are in the page cache (mincore(2) on a mapping)."""
    page = os.sysconf('SC_PAGE_SIZE')
    resident = total = 0
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            continue
        with open(path, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = np.frombuffer(mm, dtype=np.uint8)
            n_pages = (size + page - 1) // page
            vec = np.zeros(n_pages, dtype=np.uint8)
            rc = _libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size),
                               ctypes.c_void_p(vec.ctypes.data))
            del view
            if rc != 0:
                return float('nan')
            resident += int(np.count_nonzero(vec & 1))
            total += n_pages
    return resident / total if total else 0.0


def drop_page_cache(paths: list[Path]) -> dict:
    """Evict the files from the page cache: drop_caches as root, else fadvise(DONTNEED) (which
    works for clean pages of files we can open). Returns the method and what stayed cached."""
    os.sync()
    method = 'none'
    try:
        with open('/proc/sys/vm/drop_caches', 'w') as f:
            f.write('3\n')
        method = 'drop_caches'
    except OSError:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                method = 'fadvise'
            except OSError:
                pass
    cached = resident_fraction(paths)
    return {'method': method, 'cached_fraction': cached}


def read_ahead_kb(path: Path) -> str:
    """The block device's read-ahead for files under `path`: how much a page fault on a cold
    memory-mapped file may read at once."""
    dev = os.stat(path).st_dev
    sys_dir = Path(f'/sys/dev/block/{os.major(dev)}:{os.minor(dev)}')
    for candidate in (sys_dir / 'queue' / 'read_ahead_kb', sys_dir / '..' / 'queue' / 'read_ahead_kb'):
        try:
            return candidate.read_text().strip()
        except OSError:
            continue
    return 'unknown'


def cache_label(info: dict) -> str:
    cached = info['cached_fraction']
    if cached != cached:  # NaN: mincore failed
        return f"unknown ({info['method']})"
    return ('cold' if cached < 0.01 else f'warm ({100 * cached:.0f}% cached)') + f" via {info['method']}"


# --- the replay ---------------------------------------------------------------------------------

def make_replay(size: int, fill: bool):
    """A persisting Replay of `size` transitions of 10 KB float32 observations, filled with random
    data through Replay.add when `fill`."""
    import gymnasium as gym
    from slm_lab.agent.memory.replay import Replay
    obs_space = gym.spaces.Box(-1.0, 1.0, shape=(OBS_DIM,), dtype=np.float32)
    memory_spec = {'name': 'Replay', 'batch_size': 32, 'max_size': size, 'use_cer': False}
    replay = Replay(memory_spec, obs_space, gym.spaces.Discrete(4), num_envs=1, seed=0, persist=True)
    if fill:
        rng = np.random.default_rng(0)
        obs = np.empty((FILL_CHUNK, OBS_DIM), dtype=np.float32)
        next_obs = np.empty_like(obs)
        for start in range(0, size, FILL_CHUNK):
            n = min(FILL_CHUNK, size - start)
            rng.random(dtype=np.float32, out=obs)
            rng.random(dtype=np.float32, out=next_obs)
            replay.add(obs[:n], rng.integers(0, 4, n), rng.random(n, dtype=np.float32), next_obs[:n],
                       rng.random(n) < 0.01, np.zeros(n, dtype=bool))
    return replay


def buffer_bytes(replay) -> int:
    return sum(getattr(replay, key).nbytes for key in replay.ARRAY_KEYS)


def read_all(replay) -> float:
    """Touch every byte of the stored arrays (a sum per array); returns the seconds it took."""
    t0 = time.perf_counter()
    for key in replay.ARRAY_KEYS:
        arr = getattr(replay, key)
        arr.sum()
    return time.perf_counter() - t0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob('*') if p.is_file())


# --- replay phases: each runs in its own subprocess ---------------------------------------------

def write_twice(write, remove) -> tuple[float, float]:
    """Seconds of `write()` on memory the VM has not touched lately, and of an immediate repeat
    after `remove()` freed the page cache the first write filled (see the note on free page
    reporting in bench_replay)."""
    times = []
    for attempt in range(2):
        if attempt:
            remove()
        t0 = time.perf_counter()
        write()
        times.append(time.perf_counter() - t0)
    return times[0], times[1]


def phase_snapshot_save(work: Path, size: int) -> dict:
    from slm_lab.lib import arrays
    from slm_lab.persistence import snapshot as checkpoint
    from slm_lab.lib.version import git_sha
    replay = make_replay(size, fill=True)
    state = {'memory': replay.state_dict()}
    ckpt_dir = work / 'ckpt'
    peak_reset = reset_peak_rss()
    before = proc_status()
    first_s, repeat_s = write_twice(lambda: checkpoint.save_snapshot(ckpt_dir, size, state, BENCH_SPEC),
                                    lambda: shutil.rmtree(ckpt_dir))
    after = proc_status()
    (path,) = checkpoint.list_snapshots(ckpt_dir)
    # where the time goes: the CRC32 pass over the arrays in memory, and the git sha lookup
    t0 = time.perf_counter()
    for key in replay.ARRAY_KEYS:
        flat = np.ascontiguousarray(getattr(replay, key)).reshape(-1).view(np.uint8)
        crc = 0
        for start in range(0, flat.size, arrays.CRC_CHUNK):
            crc = zlib.crc32(flat[start:start + arrays.CRC_CHUNK], crc)
    crc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    git_sha()
    git_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(SAMPLES):
        replay.sample()
    ram_sample_s = (time.perf_counter() - t0) / SAMPLES
    return {'path': str(path), 'seconds': first_s, 'repeat_s': repeat_s, 'buffer_bytes': buffer_bytes(replay),
            'disk_bytes': dir_bytes(path), 'extra_peak_bytes': after['VmHWM'] - before['VmRSS'],
            'peak_reset': peak_reset, 'crc_s': crc_s, 'git_sha_s': git_s, 'ram_sample_s': ram_sample_s}


def phase_snapshot_load(work: Path, size: int, path: str) -> dict:
    from slm_lab.persistence import snapshot as checkpoint
    path = Path(path)
    replay = make_replay(size, fill=False)  # a resumed Session builds its memory before loading
    cache = drop_page_cache([p for p in path.iterdir() if p.is_file()])
    peak_reset = reset_peak_rss()
    before = proc_status()
    t0 = time.perf_counter()
    state, _ = checkpoint.load_snapshot(path)
    open_s = time.perf_counter() - t0
    replay.load_state_dict(state['memory'])
    batch = replay.sample()
    first_sample_s = time.perf_counter() - t0
    assert batch.states.shape == (32, OBS_DIM)
    at_sample = proc_status()
    read_s = read_all(replay)
    after = proc_status()
    nbytes = buffer_bytes(replay)
    return {'open_s': open_s, 'first_sample_s': first_sample_s, 'read_s': read_s, 'buffer_bytes': nbytes,
            'cache': cache_label(cache), 'peak_reset': peak_reset,
            'rss_at_sample_bytes': at_sample['VmRSS'] - before['VmRSS'],
            'extra_peak_bytes': after['VmHWM'] - before['VmRSS'] - nbytes,
            'anon_growth_bytes': after['RssAnon'] - before['RssAnon']}


def phase_snapshot_sample(work: Path, size: int, path: str) -> dict:
    """Sampling right after a resume, before the memory-mapped buffer is in the page cache."""
    from slm_lab.persistence import snapshot as checkpoint
    path = Path(path)
    replay = make_replay(size, fill=False)
    files = [p for p in path.iterdir() if p.is_file()]
    cache = drop_page_cache(files)
    state, _ = checkpoint.load_snapshot(path)
    replay.load_state_dict(state['memory'])
    t0 = time.perf_counter()
    for _ in range(SAMPLES):
        replay.sample()
    return {'cold_sample_s': (time.perf_counter() - t0) / SAMPLES, 'cache': cache_label(cache),
            'cached_after': resident_fraction(files)}


def phase_pickle_save(work: Path, size: int, protocol: int) -> dict:
    replay = make_replay(size, fill=True)
    state = replay.state_dict()
    path = work / f'replay_p{protocol}.pkl'

    def dump():
        with open(path, 'wb') as f:
            pickle.dump(state, f, protocol=protocol)
            f.flush()
            os.fsync(f.fileno())

    peak_reset = reset_peak_rss()
    before = proc_status()
    first_s, repeat_s = write_twice(dump, path.unlink)
    after = proc_status()
    return {'path': str(path), 'seconds': first_s, 'repeat_s': repeat_s, 'buffer_bytes': buffer_bytes(replay),
            'disk_bytes': path.stat().st_size, 'extra_peak_bytes': after['VmHWM'] - before['VmRSS'],
            'peak_reset': peak_reset}


def phase_pickle_load(work: Path, size: int, path: str) -> dict:
    path = Path(path)
    replay = make_replay(size, fill=False)
    cache = drop_page_cache([path])
    peak_reset = reset_peak_rss()
    before = proc_status()
    t0 = time.perf_counter()
    with open(path, 'rb') as f:
        state = pickle.load(f)
    load_s = time.perf_counter() - t0
    replay.load_state_dict(state)
    del state
    replay.sample()
    first_sample_s = time.perf_counter() - t0
    after = proc_status()
    nbytes = buffer_bytes(replay)
    return {'seconds': load_s, 'first_sample_s': first_sample_s, 'buffer_bytes': nbytes,
            'cache': cache_label(cache), 'peak_reset': peak_reset,
            'extra_peak_bytes': after['VmHWM'] - before['VmRSS'] - nbytes}


def phase_disk(work: Path, size: int) -> dict:
    """Raw sequential write (+fsync) and read of as many bytes as the Replay holds, in CHUNK-sized
    calls, after building the same Replay (so memory is in the same state as for the saves)."""
    replay = make_replay(size, fill=True)
    nbytes = buffer_bytes(replay)
    chunk = memoryview(np.random.default_rng(0).integers(0, 256, CHUNK, dtype=np.uint8).tobytes())
    path = work / 'raw.bin'

    def write():
        with open(path, 'wb', buffering=0) as f:
            left = nbytes
            while left > 0:
                left -= f.write(chunk[:min(CHUNK, left)])
            os.fsync(f.fileno())

    first_s, repeat_s = write_twice(write, path.unlink)
    cache = drop_page_cache([path])
    buf = bytearray(CHUNK)
    t0 = time.perf_counter()
    with open(path, 'rb', buffering=0) as f:
        while f.readinto(buf):
            pass
    read_s = time.perf_counter() - t0
    path.unlink()
    return {'seconds': first_s, 'repeat_s': repeat_s, 'read_s': read_s, 'bytes': nbytes, 'cache': cache_label(cache)}


def phase_verify_steps(work: Path, size: int, path: str, mode: str, steps: int) -> dict:
    """Resume-like training steps on a cold replay snapshot, with its array checksums checked
    `mode`: 'none' (sizes only, no checksum), 'background' (verify_arrays_async while the steps
    run; waited for after the last step, as save_snapshot would), or 'upfront' (load_snapshot with
    verify_arrays=True: a full read before the first step). A step is one replay.sample() and an
    Adam update of a small MLP on it, as a DQN step does."""
    import torch
    from slm_lab.lib import arrays
    from slm_lab.persistence import snapshot as checkpoint
    torch.manual_seed(0)
    path = Path(path)
    replay = make_replay(size, fill=False)
    net = torch.nn.Sequential(torch.nn.Linear(OBS_DIM, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optim = torch.optim.Adam(net.parameters(), lr=1e-3)
    cache = drop_page_cache([p for p in path.iterdir() if p.is_file()])
    marks = {1, min(100, steps), steps}
    at: dict[str, float] = {}
    t0 = time.perf_counter()
    state, manifest = checkpoint.load_snapshot(path, verify_arrays=(mode == 'upfront'))
    replay.load_state_dict(state['memory'])
    verifier = arrays.verify_arrays_async(path, manifest) if mode == 'background' else None
    for step in range(1, steps + 1):
        batch = replay.sample()
        q = net(torch.from_numpy(np.asarray(batch.states)))
        loss = (q.gather(1, torch.from_numpy(np.asarray(batch.actions, dtype=np.int64)).view(-1, 1)).squeeze(1)
                - torch.from_numpy(np.asarray(batch.rewards))).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step in marks:
            at[f'step_{step}_s'] = time.perf_counter() - t0
    if verifier is not None:
        assert verifier.result() is None
        at['verified_s'] = verifier.seconds  # measured from the verifier's start
        at['wait_after_steps_s'] = time.perf_counter() - t0 - at[f'step_{steps}_s']
    return {'mode': mode, 'cache': cache_label(cache), 'array_bytes': sum(
        info['size'] for name, info in manifest['files'].items() if name != checkpoint.STATE_FILE), **at}


PHASES = {'snapshot-save': phase_snapshot_save, 'snapshot-load': phase_snapshot_load,
          'snapshot-sample': phase_snapshot_sample, 'verify-steps': phase_verify_steps,
          'pickle-save': phase_pickle_save, 'pickle-load': phase_pickle_load, 'disk': phase_disk}


def run_phase(name: str, work: Path, **kwargs) -> dict:
    """Run one phase in a fresh Python process; its result comes back as the last stdout line."""
    cmd = [sys.executable, __file__, '--phase', name, '--work-dir', str(work), '--phase-args', json.dumps(kwargs)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=PHASE_TIMEOUT_S)
    if out.returncode != 0:
        raise RuntimeError(f'phase {name} failed:\n{out.stderr[-3000:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the table ----------------------------------------------------------------------------------

class Table:
    """Rows of (what, best, median, unit, note) for figures measured several times."""

    def __init__(self):
        self.rows: list[tuple[str, str, str, str, str]] = []

    def add(self, what: str, values: list[float], unit: str, note: str = '', lower_is_better: bool = True,
            fmt: str = '{:.3f}') -> None:
        best = min(values) if lower_is_better else max(values)
        self.rows.append((what, fmt.format(best), fmt.format(statistics.median(values)), unit, note))

    def print(self) -> None:
        header = ('measurement', 'best', 'median', 'unit', 'note')
        widths = [max(len(r[i]) for r in self.rows + [header]) for i in range(5)]
        line = '  '.join(f'{{:{"<" if i in (0, 3, 4) else ">"}{w}}}' for i, w in enumerate(widths))
        print(line.format(*header))
        print('  '.join('-' * w for w in widths))
        for row in self.rows:
            print(line.format(*row))


def gb(nbytes: float) -> float:
    return nbytes / 1e9


# --- part 1: PPO / DQN sessions -----------------------------------------------------------------

SESSION_CASES = [
    ('PPO CartPole', 'spec/demo.json', 'ppo_cartpole', []),
    ('DQN CartPole', 'spec/benchmark/dqn/dqn_cartpole_zoo.json', 'dqn_cartpole_zoo', ['meta.snapshot_replay=false']),
    ('DQN CartPole + replay', 'spec/benchmark/dqn/dqn_cartpole_zoo.json', 'dqn_cartpole_zoo',
     ['meta.snapshot_replay=true']),
]


def bench_sessions(work: Path, table: Table, reps: int, frames: int) -> None:
    import logging
    from slm_lab import __version__
    from slm_lab.persistence import snapshot as checkpoint
    from slm_lab.experiment.session import Session
    from slm_lab.persistence.run_dir import RunDir
    from slm_lab.lib import logger as lab_logger
    from slm_lab.spec import load_spec
    lab_logger.setup_console(logging.WARNING)
    for case, (label, spec_file, spec_name, overrides) in enumerate(SESSION_CASES):
        spec = load_spec(str(REPO_ROOT / spec_file), spec_name,
                         [f'env.max_frame={frames}', 'meta.random_seed=0'] + overrides)
        meta = spec['meta']
        meta.update(experiment_ts='bench', lab_version=__version__, mode='train')
        run_dir = RunDir.for_spec(str(work / 'sessions'), spec_name, f'case{case}')
        run_dir.create()
        session = Session(spec, run_dir, 'train')
        session.run()
        state = session.state_dict()
        save_s, load_s, size = [], [], 0
        for rep in range(reps):
            ckpt_dir = work / 'sessions' / f'case{case}_ckpt_{rep}'
            t0 = time.perf_counter()
            path = checkpoint.save_snapshot(ckpt_dir, session.clock.frame, state, spec)
            save_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            loaded, _ = checkpoint.load_snapshot(path)
            load_s.append(time.perf_counter() - t0)
            size = dir_bytes(path)
            del loaded
            shutil.rmtree(ckpt_dir)
        session.close()
        note = f'{size / 1e6:.2f} MB on disk, frame {session.clock.frame}'
        table.add(f'{label}: snapshot save', save_s, 's', note + ', fsync included')
        table.add(f'{label}: snapshot load', load_s, 's', 'load_snapshot, page cache warm')
        shutil.rmtree(run_dir.root)


# --- part 2: the 10 KB x N replay ---------------------------------------------------------------

def bench_replay(work: Path, table: Table, reps: int, size: int) -> None:
    results: dict[str, list[dict]] = {k: [] for k in ('save', 'load', 'sample', 'p4 save', 'p4 load', 'p5 save',
                                                      'p5 load', 'disk')}
    # This VM hands freed memory back to its host (free page reporting), so whichever phase runs
    # first may pay for fresh page-cache pages: the order of the methods rotates every repetition.
    methods = ['snapshot', 'pickle 4', 'pickle 5', 'disk']
    for rep in range(reps):
        for method in methods[rep % len(methods):] + methods[:rep % len(methods)]:
            rep_dir = work / f'{method.replace(" ", "")}_{rep}'
            rep_dir.mkdir()
            if method == 'snapshot':
                saved = run_phase('snapshot-save', rep_dir, size=size)
                results['save'].append(saved)
                results['load'].append(run_phase('snapshot-load', rep_dir, size=size, path=saved['path']))
                results['sample'].append(run_phase('snapshot-sample', rep_dir, size=size, path=saved['path']))
            elif method == 'disk':
                results['disk'].append(run_phase('disk', rep_dir, size=size))
            else:
                protocol = int(method.split()[1])
                saved = run_phase('pickle-save', rep_dir, size=size, protocol=protocol)
                results[f'p{protocol} save'].append(saved)
                results[f'p{protocol} load'].append(run_phase('pickle-load', rep_dir, size=size, path=saved['path']))
            shutil.rmtree(rep_dir)

    nbytes = results['save'][0]['buffer_bytes']
    assert all(r['bytes'] == nbytes for r in results['disk']), 'raw disk test must move as many bytes as the buffer'
    print(f'\nreplay: {size:,} transitions x 10,240-byte observations; Replay stores states and next_states, '
          f'so the buffer is {gb(nbytes):.3f} GB ({nbytes:,} bytes); snapshot on disk '
          f"{gb(results['save'][0]['disk_bytes']):.3f} GB")
    peak_ok = all(r['peak_reset'] for k in results if k not in ('disk', 'sample') for r in results[k])
    print(f"peak memory reset with /proc/self/clear_refs before each phase: {'yes' if peak_ok else 'NO'}; "
          f'read_ahead_kb of the disk: {read_ahead_kb(work)}')

    def rate(rows, key='seconds'):
        return [gb(nbytes) / r[key] for r in rows]

    def add_rate(what, rows, note, key='seconds'):
        table.add(what, rate(rows, key), 'GB/s', note, lower_is_better=False, fmt='{:.2f}')

    def add_extra(what, rows, note=''):
        values = [r['extra_peak_bytes'] for r in rows]
        pct = 100 * statistics.median(values) / nbytes
        table.add(what, [v / 1e6 for v in values], 'MB', f'{pct:.2f}% of the buffer (median){note}', fmt='{:.1f}')

    def caches(rows):
        return ', '.join(sorted({r['cache'] for r in rows}))

    save, load = results['save'], results['load']
    add_rate('replay snapshot save', save, 'save_snapshot incl. fsync; first write in the process')
    add_rate('replay snapshot save, repeated', save, 'the same save again at once', key='repeat_s')
    table.add('  CRC32 of the arrays (part of save)', [r['crc_s'] for r in save], 's',
              'zlib.crc32 over the same bytes in memory, timed alone')
    table.add('  git rev-parse (part of save)', [r['git_sha_s'] for r in save], 's', 'git_sha(), called by every save')
    add_extra('replay snapshot save: extra peak memory', save)
    table.add('replay snapshot: load_snapshot', [r['open_s'] for r in load], 's', f'page cache {caches(load)}')
    table.add('replay snapshot: to first sample', [r['first_sample_s'] for r in load], 's',
              'load_snapshot + load_state_dict + sample()')
    sample = results['sample']
    table.add(f'replay snapshot: mean of the first {SAMPLES} samples', [1e3 * r['cold_sample_s'] for r in sample],
              'ms', f"page cache {caches(sample)}; "
              f"then {100 * statistics.median(r['cached_after'] for r in sample):.0f}%"
              ' of the snapshot cached', fmt='{:.1f}')
    table.add('replay: mean sample, buffer in RAM', [1e3 * r['ram_sample_s'] for r in save], 'ms',
              f'{SAMPLES} samples from the filled in-memory Replay', fmt='{:.2f}')
    add_rate('replay snapshot: full read after load', load, 'sum over every memory-mapped array', key='read_s')
    table.add('replay snapshot: RSS growth at first sample', [r['rss_at_sample_bytes'] / 1e6 for r in load], 'MB',
              'memory in use when training can go on', fmt='{:.1f}')
    add_extra('replay snapshot load: extra peak memory', load, ', after the full read; mapped file pages '
              'count as the buffer')

    for protocol in (4, 5):
        saved, loaded = results[f'p{protocol} save'], results[f'p{protocol} load']
        what = f'pickle protocol {protocol}'
        add_rate(f'{what}: dump + fsync', saved, f"{gb(saved[0]['disk_bytes']):.3f} GB file; first write")
        add_rate(f'{what}: dump + fsync, repeated', saved, 'the same dump again at once', key='repeat_s')
        add_extra(f'{what}: dump extra peak memory', saved)
        add_rate(f'{what}: load', loaded, f'page cache {caches(loaded)}; a full copy in memory')
        table.add(f'{what}: to first sample', [r['first_sample_s'] for r in loaded], 's',
                  'pickle.load + load_state_dict + sample()')
        add_extra(f'{what}: load extra peak memory', loaded)

    disk = results['disk']
    add_rate('raw disk: sequential write + fsync', disk, 'same byte count, 64 MiB f.write calls; first write')
    add_rate('raw disk: sequential write + fsync, repeated', disk, 'the same write again at once', key='repeat_s')
    add_rate('raw disk: sequential read', disk, f'page cache {caches(disk)}; 64 MiB readinto calls', key='read_s')


# --- part 4: the background checksum check on resume --------------------------------------------

VERIFY_MODES = ('none', 'background', 'upfront')


def bench_verify(work: Path, table: Table, reps: int, size: int, steps: int) -> None:
    rows: dict[str, list[dict]] = {mode: [] for mode in VERIFY_MODES}
    saved = run_phase('snapshot-save', work, size=size)
    for rep in range(reps):
        for mode in VERIFY_MODES[rep % 3:] + VERIFY_MODES[:rep % 3]:  # the order rotates, as in bench_replay
            rows[mode].append(run_phase('verify-steps', work, size=size, path=saved['path'], mode=mode, steps=steps))
    nbytes = rows['none'][0]['array_bytes']
    print(f'\nverify: a replay snapshot of {gb(nbytes):.3f} GB of arrays ({size:,} transitions), page cache '
          f"{', '.join(sorted({r['cache'] for mode in rows for r in rows[mode]}))}; a step is replay.sample() + "
          f'one Adam update of a {OBS_DIM}-64-4 MLP')
    mid = min(100, steps)
    for mode, label in (('none', 'sizes only (no checksum)'), ('background', 'background checksum'),
                        ('upfront', 'checksum before the first step')):
        for step in sorted({1, mid, steps}):
            table.add(f'resume, {label}: to step {step}', [r[f'step_{step}_s'] for r in rows[mode]], 's',
                      'from load_snapshot')
    table.add('resume, background checksum: check done', [r['verified_s'] for r in rows['background']], 's',
              f'{gb(nbytes) / statistics.median(r["verified_s"] for r in rows["background"]):.2f} GB/s while training')
    table.add(f'resume, background checksum: wait after step {steps}',
              [r['wait_after_steps_s'] for r in rows['background']], 's', 'what a save at that point would wait')


# --- part 3: train@latest to the first resumed step ---------------------------------------------

def _timed_lab(cwd: Path, args: list[str], markers: dict[str, str]) -> dict:
    """Run run_lab.py in cwd; seconds from launch to exit and to the first output line containing
    each marker."""
    cmd = [sys.executable, str(REPO_ROOT / 'run_lab.py'), str(REPO_ROOT / 'spec/demo.json'), 'ppo_cartpole'] + args
    env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        for key, marker in markers.items():
            if key not in seen and marker in line:
                seen[key] = time.perf_counter() - t0
    rc = proc.wait()
    total = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f'{" ".join(cmd)} exited {rc}:\n{"".join(lines[-20:])}')
    return {'total_s': total, **seen}


def bench_resume(work: Path, table: Table, reps: int) -> None:
    end_to_end, to_step, load_s, imports = [], [], [], []
    for rep in range(reps):
        cwd = work / f'resume_{rep}'
        cwd.mkdir()
        _timed_lab(cwd, ['train', '-s', 'env.max_frame=2000'], {})
        timed = _timed_lab(cwd, ['train@latest', '-s', 'env.max_frame=2008'],
                           {'first_step': '| frame 2008/2008'})
        end_to_end.append(timed['total_s'])
        to_step.append(timed['first_step'])
        (log,) = (cwd / 'data').glob('ppo_cartpole_*/info/*_resumes.json')
        load_s.append(json.loads(log.read_text())[-1]['load_s'])
        shutil.rmtree(cwd)
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, '-c', 'import torch, gymnasium, pandas, plotly'], check=True)
        imports.append(time.perf_counter() - t0)
    table.add('train@latest: end to end', end_to_end, 's', 'process start to exit (one 8-env step, then finish)')
    table.add('train@latest: to first resumed step', to_step, 's', 'process start to the frame-2008 log line')
    table.add('train@latest: load_s in info/*_resumes.json', load_s, 's',
              'in process: Session build + load_latest_snapshot')
    table.add('python -c "import torch, gymnasium, pandas, plotly"', imports, 's', 'start-up + imports alone')


# --- main ---------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(
        description='Measure snapshot save/load speed and memory: PPO and DQN CartPole sessions, a replay of '
                    '10 KB observations (snapshot vs pickle vs the raw disk), and train@latest to the first '
                    'resumed step. Prints a table of best and median over --reps repetitions.',
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split('\n\n', 2)[2])
    parser.add_argument('--quick', action='store_true',
                        help=f'a 10x smaller replay ({FULL_REPLAY_SIZE // 10:,} transitions) and 1 repetition')
    parser.add_argument('--reps', type=int, default=None, help='repetitions of each measurement (3; 1 with --quick)')
    parser.add_argument('--replay-size', type=int, default=None,
                        help=f'transitions in the replay ({FULL_REPLAY_SIZE:,}; '
                             f'{FULL_REPLAY_SIZE // 10:,} with --quick)')
    parser.add_argument('--frames', type=int, default=4000, help='frames each CartPole session trains before saving')
    parser.add_argument('--parts', default='sessions,replay,resume,verify',
                        help='comma-separated: sessions, replay, resume, verify (default: all)')
    parser.add_argument('--verify-size', type=int, default=None,
                        help='transitions in the replay of the verify part (15,000: ~0.3 GB; 1,500 with --quick)')
    parser.add_argument('--steps', type=int, default=500, help='training steps timed after a resume (verify part)')
    parser.add_argument('--phase', help=argparse.SUPPRESS)
    parser.add_argument('--work-dir', help=argparse.SUPPRESS)
    parser.add_argument('--phase-args', help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.phase:  # a child process running one replay phase
        result = PHASES[args.phase](Path(args.work_dir), **json.loads(args.phase_args))
        print(json.dumps(result))
        return

    reps = args.reps or (1 if args.quick else 3)
    size = args.replay_size or (FULL_REPLAY_SIZE // 10 if args.quick else FULL_REPLAY_SIZE)
    parts = [p.strip() for p in args.parts.split(',') if p.strip()]
    unknown = set(parts) - {'sessions', 'replay', 'resume', 'verify'}
    if unknown:
        parser.error(f'unknown part(s) {sorted(unknown)}; valid: sessions, replay, resume, verify')
    verify_size = args.verify_size or (VERIFY_REPLAY_SIZE // 10 if args.quick else VERIFY_REPLAY_SIZE)
    print(f'{time.strftime("%Y-%m-%d %H:%M")} | {os.cpu_count()} CPUs | python {sys.version.split()[0]} | '
          f'reps {reps} | replay {size:,} transitions | verify replay {verify_size:,} transitions | '
          f'load average {os.getloadavg()[0]:.2f}')
    data_dir = REPO_ROOT / 'data'
    data_dir.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix='bench_checkpoint_', dir=data_dir))
    table = Table()
    try:
        if 'sessions' in parts:
            bench_sessions(work, table, reps, args.frames)
        if 'replay' in parts:
            bench_replay(work, table, reps, size)
        if 'resume' in parts:
            bench_resume(work, table, reps)
        if 'verify' in parts:
            verify_dir = work / 'verify'
            verify_dir.mkdir()
            bench_verify(verify_dir, table, reps, verify_size, args.steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f'load average at the end {os.getloadavg()[0]:.2f}\n')
    table.print()


if __name__ == '__main__':
    main()
