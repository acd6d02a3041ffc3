"""Snapshots of a 1M-transition Atari replay: save, incremental save and load, against the disk.

    python bench/replay_io.py                        # 1,000,000 transitions: ~7.3 GB of frames
    python bench/replay_io.py --transitions 100000   # a quick run (~0.7 GB)
    python bench/replay_io.py --env pong --transitions 100000          # filled from real env steps
    python bench/replay_io.py --env halfcheetah --transitions 100000

--env fills the replay from real env steps instead (random actions, NUM_ENVS envs made as the lab
makes them, the final observation as an episode's last next observation, as the Session passes
it): `pong` is ALE/Pong-v5 (stacked (4, 84, 84) uint8 frames: a FrameStore), `halfcheetah` is
HalfCheetah-v5 (17 floats: whole arrays), each in a persisting Replay as DQN and SAC keep it. It
times the full save and its size on disk, the incremental save after --more frames (default
10,000) and a raw write of the same bytes beside the full save; no cold load (dropping the page
cache would slow whatever else shares the machine).

The replay is a persisting `Replay` of (4, 84, 84) uint8 observations (ALE/ envs' shape), so it
keeps each frame once in its FrameStore. It is filled through `Replay.add` by 8 synthetic envs,
vector steps as the Session makes them: each sub-env's stack continues frame by frame, episodes
of 500-1500 steps start from zero-padded stacks (as FrameStackObservation's), and each frame is
one of 4096 random frames with the frame's number written into its first 8 bytes (random-looking,
never repeated; random numbers for 7 GB would take longer than the rest of the benchmark).

Phases, in this order, in one process unless said:
  full save    checkpoint.save_snapshot({'memory': replay.state_dict()}) into an empty directory,
               fsync included, alternated --reps times (2) with
  raw write    a file of the snapshot's byte count written with os.write of a 64 MiB buffer + one
               fsync: the disk's sequential write speed, next to each save (the order flips at
               each pair: the first big write of a process is slow on this VM, docs/BENCHMARKS.md);
               then that file read back cold (page cache dropped) with readinto in 64 MiB chunks
  incremental  after --increment (1%) more transitions, a save beside the last full snapshot: only the
               chunks they changed are written, the others hard-linked
  load         in a fresh subprocess, page cache dropped: load_snapshot + Replay.load_state_dict
               + the first replay.sample() (the first resumed step's batch), then 100 samples,
               then the whole frame ring read once through its mapping (GB/s)
Peak extra memory of a save is VmHWM (reset through /proc/self/clear_refs just before the phase)
minus the RSS before it; after a load, RSS counts the snapshot's file pages the mapping has read
(page cache, given back under memory pressure), so its anonymous memory (RssAnon) is given too.
GB = 10^9 bytes. Files go to a temporary directory under data/ (the repository's
disk), deleted at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

from bench.checkpoint import cache_label, drop_page_cache, proc_status, reset_peak_rss  # noqa: E402

OBS_SHAPE = (4, 84, 84)
NUM_ENVS = 8
POOL = 4096  # distinct random frames the synthetic frames are drawn from
CHUNK = 64 << 20
SPEC = {'bench': 'replay_io'}


def make_replay(max_size: int, obs_space=None, action_space=None):
    """A persisting Replay of `max_size` transitions: of synthetic Atari stacks, or of the spaces given."""
    import gymnasium as gym
    from slm_lab.agent.memory.replay import Replay
    spec = {'name': 'Replay', 'batch_size': 32, 'max_size': max_size, 'use_cer': False}
    if obs_space is None:
        obs_space, action_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8), gym.spaces.Discrete(6)
    return Replay(spec, obs_space, action_space, NUM_ENVS, seed=0, persist=True)


REAL_ENVS = {'pong': 'ALE/Pong-v5', 'halfcheetah': 'HalfCheetah-v5'}


class RealEnv:
    """NUM_ENVS sub-envs of a real env (the lab's make_env), stepped with random actions; step()
    returns what the Session hands to the agent's update."""

    def __init__(self, name: str, seed: int = 0):
        from slm_lab.env import agent_action_space, make_env
        from slm_lab.env.schema import check_env
        self.env = make_env(check_env({'name': REAL_ENVS[name], 'num_envs': NUM_ENVS, 'max_frame': 10**9}))
        self.obs_space, self.action_space = self.env.single_observation_space, agent_action_space(self.env)
        self.obs, _ = self.env.reset(seed=seed)
        self.env.action_space.seed(seed)

    def step(self):
        action = self.env.action_space.sample()
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        true_next_obs = next_obs
        if np.logical_or(terminated, truncated).any():  # as Session.run
            true_next_obs = next_obs.copy()
            mask = info['_final_obs']
            true_next_obs[mask] = np.stack(info['final_obs'][mask])
        obs, self.obs = self.obs, next_obs
        return obs, action, reward, true_next_obs, terminated, truncated


class SyntheticAtari:
    """NUM_ENVS sub-envs of stacked synthetic frames, stepped as a vector env with same-step
    autoreset (next_obs of an episode's last step is its final observation)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 256, (POOL,) + OBS_SHAPE[1:], dtype=np.uint8)
        self.count = 0
        self.stacks = np.zeros((NUM_ENVS,) + OBS_SHAPE, np.uint8)
        self.left = self.rng.integers(500, 1500, NUM_ENVS)
        for e in range(NUM_ENVS):
            self.stacks[e, -1] = self.frame()

    def frame(self) -> np.ndarray:
        f = self.pool[self.count % POOL].copy()
        f.reshape(-1)[:8] = np.frombuffer(np.int64(self.count + 1).tobytes(), np.uint8)
        self.count += 1
        return f

    def step(self):
        obs = self.stacks.copy()
        nxt = np.empty_like(obs)
        nxt[:, :-1] = obs[:, 1:]
        for e in range(NUM_ENVS):
            nxt[e, -1] = self.frame()
        self.left -= 1
        done = self.left <= 0
        self.stacks = nxt.copy()
        for e in np.flatnonzero(done):
            self.stacks[e] = 0
            self.stacks[e, -1] = self.frame()
            self.left[e] = self.rng.integers(500, 1500)
        return obs, self.rng.integers(0, 6, NUM_ENVS), np.sign(self.rng.normal(size=NUM_ENVS)).astype(np.float32), \
            nxt, done, np.zeros(NUM_ENVS, bool)


def fill(replay, env: SyntheticAtari, transitions: int) -> float:
    t0 = time.perf_counter()
    for _ in range(-(-transitions // NUM_ENVS)):
        replay.add(*env.step())
    return time.perf_counter() - t0


def raw_write(path: Path, nbytes: int) -> float:
    buf = np.random.default_rng(1).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[:min(CHUNK, left)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def raw_read(path: Path) -> float:
    buf = bytearray(CHUNK)
    t0 = time.perf_counter()
    with open(path, 'rb', buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def measured(fn):
    """(result, seconds, peak extra bytes over the RSS before) of fn()."""
    reset_peak_rss()
    before = proc_status()['VmRSS']
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    return result, seconds, proc_status()['VmHWM'] - before


def written_bytes(path: Path) -> tuple[int, int, int]:
    """(bytes written, bytes hard-linked from earlier snapshots, files written) of a snapshot."""
    from slm_lab.persistence import snapshot as checkpoint
    files = checkpoint.read_manifest(path)['files']
    written = sum(i['size'] for i in files.values() if not i.get('reused'))
    linked = sum(i['size'] for i in files.values() if i.get('reused'))
    return written, linked, sum(1 for i in files.values() if not i.get('reused'))


def phase_load(path: str, max_size: int) -> dict:
    from slm_lab.persistence import snapshot as checkpoint
    files = [p for p in Path(path).iterdir() if p.is_file()]
    cache = drop_page_cache(files)
    replay = make_replay(max_size)
    base_rss, base_anon = proc_status()['VmRSS'], proc_status()['RssAnon']
    reset_peak_rss()
    t0 = time.perf_counter()
    state, _ = checkpoint.load_snapshot(Path(path))
    t_load = time.perf_counter() - t0
    replay.load_state_dict(state['memory'])
    t_state = time.perf_counter() - t0
    batch = replay.sample()
    t_first = time.perf_counter() - t0
    rss_first = proc_status()['VmRSS'] - base_rss
    t1 = time.perf_counter()
    for _ in range(100):
        replay.sample()
    t_100 = (time.perf_counter() - t1) / 100
    frames = replay.frame_store.frames
    t1 = time.perf_counter()
    flat = frames.reshape(-1)
    step = 1 << 28
    total = 0
    for start in range(0, len(flat), step):
        total += int(flat[start:start + step:4096].sum())  # a byte of every page: reads the whole ring
    t_read = time.perf_counter() - t1
    status = proc_status()
    return {'cache': cache_label(cache), 'load_snapshot_s': t_load, 'load_state_dict_s': t_state - t_load,
            'first_sample_s': t_first, 'rss_at_first_sample': rss_first, 'mean_next_100_samples_s': t_100,
            'mapped': not frames.flags.owndata, 'frames_bytes': frames.nbytes, 'read_all_s': t_read,
            'peak_extra_while_loading': status['VmHWM'] - base_rss, 'rss_after_read_all': status['VmRSS'] - base_rss,
            'anon_after_read_all': status['RssAnon'] - base_anon,
            'batch_shape': list(batch.states.shape)}


def replay_arrays(replay) -> list[np.ndarray]:
    """The arrays a replay allocates for its transitions."""
    store = replay.frame_store
    if store is None:
        return [getattr(replay, key) for key in replay.ARRAY_KEYS]
    return [store.frames, store.frame_idx, store.oldest, replay.actions, replay.rewards, replay.terminateds]


def bench_real_env(args) -> None:
    """--env: a replay filled from real env steps; full save, its size on disk, incremental save."""
    from slm_lab.persistence import snapshot as checkpoint
    from slm_lab.resources import bytes_under
    gb = 1e9
    work = Path(tempfile.mkdtemp(prefix='bench_replay_io_', dir=REPO_ROOT / 'data'))
    try:
        env = RealEnv(args.env)
        replay = make_replay(args.transitions, env.obs_space, env.action_space)
        fill_s = fill(replay, env, args.transitions)
        held = sum(a.nbytes for a in replay_arrays(replay))
        storage = 'frame by frame (FrameStore)' if replay.frame_store is not None else 'as whole arrays'
        print(f'{REAL_ENVS[args.env]}: {replay.size:,} transitions of {replay.obs_shape} {replay.obs_dtype} stored '
              f'{storage}, from random actions in {NUM_ENVS} envs ({fill_s:.0f} s); the replay holds '
              f'{held / gb:.3f} GB; RSS {proc_status()["VmRSS"] / gb:.2f} GB')
        ckpt, raw = work / 'ckpt', work / 'raw.bin'
        for rep in range(args.reps):
            load_avg = os.getloadavg()[0]
            shutil.rmtree(ckpt, ignore_errors=True)
            if replay.frame_store is not None:  # no earlier snapshot to reuse
                for chunks in (replay.frame_store.frame_chunks, replay.frame_store.row_chunks):
                    chunks.ids = [None] * len(chunks.ids)
            path, seconds, extra = measured(
                lambda: checkpoint.save_snapshot(ckpt, 1, {'memory': replay.state_dict()}, SPEC))
            written, _, nfiles = written_bytes(path)
            raw_s = raw_write(raw, written)
            raw.unlink()
            print(f'full save ({rep + 1}): {seconds:.3f} s for {written / gb:.3f} GB in {nfiles} files '
                  f'({bytes_under(path) / gb:.3f} GB on disk), {written / seconds / gb:.2f} GB/s; a raw write + '
                  f'fsync of the same bytes right after: {raw_s:.3f} s ({written / raw_s / gb:.2f} GB/s); peak '
                  f'extra memory {extra / 2**20:.1f} MiB; load average {load_avg:.1f}')
        fill(replay, env, args.more)
        path2, seconds, extra = measured(
            lambda: checkpoint.save_snapshot(ckpt, 2, {'memory': replay.state_dict()}, SPEC))
        written, linked, nfiles = written_bytes(path2)
        print(f'incremental save after {args.more:,} more frames: {seconds:.3f} s, wrote {written / gb:.3f} GB in '
              f'{nfiles} files ({written / (written + linked):.1%} of the snapshot), hard-linked {linked / gb:.3f} '
              f'GB; the two snapshots hold {bytes_under(ckpt) / gb:.3f} GB on disk; peak extra memory '
              f'{extra / 2**20:.1f} MiB; load average {os.getloadavg()[0]:.1f}')
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--transitions', type=int, default=1_000_000)
    parser.add_argument('--increment', type=float, default=0.01, help='fraction added before the incremental save')
    parser.add_argument('--reps', type=int, default=2, help='pairs of (full save, raw write) timed')
    parser.add_argument('--env', choices=sorted(REAL_ENVS), help='fill the replay from this real env instead')
    parser.add_argument('--more', type=int, default=10_000, help='with --env: frames added before the incremental save')
    parser.add_argument('--phase', help=argparse.SUPPRESS)
    parser.add_argument('--path', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == 'load':
        print(json.dumps(phase_load(args.path, args.transitions)))
        return
    if args.env:
        bench_real_env(args)
        return
    from slm_lab.persistence import snapshot as checkpoint
    gb = 1e9
    work = Path(tempfile.mkdtemp(prefix='bench_replay_io_', dir=REPO_ROOT / 'data'))
    try:
        replay = make_replay(args.transitions)
        env = SyntheticAtari()
        fill_s = fill(replay, env, args.transitions)
        store = replay.frame_store
        held = sum(a.nbytes for a in (store.frames, store.frame_idx, store.oldest, replay.actions, replay.rewards,
                                      replay.terminateds))
        print(f'replay: {replay.size:,} transitions of {OBS_SHAPE} uint8, {store.frame_count:,} frames added, '
              f'ring {store.ring:,} frames; holds {held / gb:.2f} GB (two stacks per transition: '
              f'{2 * replay.size * np.prod(OBS_SHAPE) / gb:.1f} GB); filled in {fill_s:.0f} s; '
              f'RSS {proc_status()["VmRSS"] / gb:.2f} GB')

        # full saves and raw writes of the same byte count, alternated (--reps pairs; the order flips
        # at each pair, so neither always pays for being the first big write of the process)
        ckpt = work / 'ckpt'
        raw = work / 'raw.bin'
        nbytes = None
        pairs = []
        for rep in range(args.reps):
            pair = {}
            for what in (('raw', 'save') if rep % 2 == 0 else ('save', 'raw')):
                load_avg = os.getloadavg()[0]
                if what == 'save':
                    shutil.rmtree(ckpt, ignore_errors=True)
                    for chunks in (store.frame_chunks, store.row_chunks):  # no earlier snapshot to reuse
                        chunks.ids = [None] * len(chunks.ids)
                    path, seconds, extra = measured(
                        lambda: checkpoint.save_snapshot(ckpt, 1, {'memory': replay.state_dict()}, SPEC))
                    nbytes, _, nfiles = written_bytes(path)
                    print(f'full save ({rep + 1}): {seconds:.2f} s, {nbytes / gb:.2f} GB in {nfiles} files, '
                          f'{nbytes / seconds / gb:.2f} GB/s, peak extra memory {extra / 2**20:.1f} MiB '
                          f'({100 * extra / held:.2f}% of the replay); load average {load_avg:.1f}')
                else:
                    raw.unlink(missing_ok=True)
                    size = nbytes or held
                    seconds = raw_write(raw, size)
                    print(f'raw write + fsync ({rep + 1}): {size / gb:.2f} GB in {seconds:.2f} s, '
                          f'{size / seconds / gb:.2f} GB/s; load average {load_avg:.1f}')
                pair[what] = (seconds, nbytes or held)
            pairs.append(pair)
            share = pair['raw'][0] / pair['raw'][1] * pair['save'][1] / pair['save'][0]
            print(f'  pair {rep + 1}: full save at {share:.0%}'
                  f' of the raw write speed')
        cache = drop_page_cache([raw])
        read_s = raw_read(raw)
        print(f'raw read of {raw.stat().st_size / gb:.2f} GB: {raw.stat().st_size / read_s / gb:.2f} GB/s '
              f'({cache_label(cache)})')
        raw.unlink()

        # incremental
        added = max(1, int(args.increment * args.transitions))
        fill(replay, env, added)
        path2, seconds, extra = measured(lambda: checkpoint.save_snapshot(ckpt, 2, {'memory': replay.state_dict()},
                                                                          SPEC))
        written, linked, nfiles = written_bytes(path2)
        print(f'incremental save after {added:,} more transitions ({added / args.transitions:.1%}): {seconds:.3f} s, '
              f'wrote {written / gb:.3f} GB in {nfiles} files ({written / (written + linked):.1%} of the snapshot), '
              f'hard-linked {linked / gb:.2f} GB; peak extra memory {extra / 2**20:.1f} MiB')
        print(f'  the new transitions\' own bytes: {added * (np.prod(OBS_SHAPE[1:]) + 8 * 2 + 8 + 8) / gb:.3f} GB '
              f'(one frame + slots and scalars each)')

        # load, in a fresh process
        replay = store = None
        out = subprocess.run([sys.executable, __file__, '--phase', 'load', '--path', str(path2),
                              '--transitions', str(args.transitions)], capture_output=True, text=True, check=True)
        load = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"load ({load['cache']}): load_snapshot {load['load_snapshot_s']:.3f} s, load_state_dict "
              f"{load['load_state_dict_s']:.3f} s (frames {'mapped' if load['mapped'] else 'copied'}), first sample "
              f"at {load['first_sample_s']:.3f} s (RSS +{load['rss_at_first_sample'] / 2**20:.0f} MiB); next 100 "
              f"samples {1000 * load['mean_next_100_samples_s']:.2f} ms each; whole ring read through the mapping "
              f"{load['frames_bytes'] / load['read_all_s'] / gb:.2f} GB/s; after reading everything: RSS "
              f"+{load['rss_after_read_all'] / 2**20:.0f} MiB (page cache mapped from the snapshot's files), of which "
              f"anonymous memory +{load['anon_after_read_all'] / 2**20:.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
