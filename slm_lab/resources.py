"""What a spec needs of the machine, and what the machine has: memory and CPU cores.

The memory estimate runs before a run's directory exists and before anything spec-sized is
built, so a spec the machine cannot hold (a net of 40 GB, a replay of 14 TiB) is refused in one
line instead of failing in an allocation halfway through. It counts what grows with the spec's
sizes and is meant to be conservative (it rounds up), not exact:

  nets     each MLP of the algorithm, counted from its layer widths: a trained parameter is
           float32 weights + gradients + two optimizer moments (as Adam) = 16 bytes, a target
           net's only its weights (4 bytes)
  memory   what the memory declares (Memory.storage_needs; an algorithm's own replays, SIL's:
           Algorithm.owned_replay_needs); so far:
           Replay: max_size x (2 observations + action + reward + terminated), plus a sampled
           batch; for stacked uint8 frames (Atari), which the replay stores once each, its frame
           ring (about one frame per transition, see memory/frames.py's FrameStore) and frame slots instead;
           PrioritizedReplay the same plus its sum tree; OnPolicyBatchReplay: time_horizon x num_envs steps,
           twice (the buffer and the
           batch it hands out), plus their float32 tensors and the activations of a pass over them
  envs     num_envs x a small allowance per env (a process per env when vectorization is async)
  process  python, torch and gymnasium in one session process
and multiplies a session's need by the sessions that run at once (see `session_pool_width`).

The same estimate settles `meta.snapshot_replay` when a spec leaves it null (`decide_snapshot_replay`):
the replays go into snapshots when that is cheap next to this machine's memory and the disk the run
writes to.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple


from slm_lab.lib import logger as lab_logger
from slm_lab.lib.cores import usable_cores
from slm_lab.lib.errors import SpecError

logger = lab_logger.get_logger('slm_lab.resources')

FLOAT_BYTES = 4
TRAINED_PARAM_BYTES = 4 * FLOAT_BYTES  # weights, gradients, Adam's two moments
FROZEN_PARAM_BYTES = FLOAT_BYTES  # a target net: weights only
ACTIVATION_COPIES = 3  # per unit in a training pass: pre-activation, activation kept for backward, its gradient
PROCESS_BYTES = 300 * 2**20  # a session process with torch and gymnasium imported measures ~260 MB resident
SYNC_ENV_BYTES = 64 * 2**10  # a classic-control env object is a few KB
ASYNC_ENV_BYTES = 64 * 2**20  # an async env is a worker process (~30 MB resident for CartPole)
# meta.snapshot_replay null: the replays go into snapshots when they take at most 1/this of the memory
# available and their kept snapshots at most 1/this of the free disk (decide_snapshot_replay). A quarter:
# a snapshot writes the replays through the page cache and a resume maps them back from its files, so
# those pages sit beside the run (which holds the replays anyway), and a save stays a few seconds at
# disk speed; the other 3/4 of the free disk stay for everything else that writes there
SNAPSHOT_REPLAY_SHARE = 4


class Need(NamedTuple):
    """One item of the estimate: what it is, the spec key that drives its size, bytes; for a
    replay that meta.snapshot_replay puts into snapshots, `on_disk`: the bytes that one session's
    kept snapshots hold of it when it is full (0 for anything else)."""
    what: str
    key: str
    nbytes: int
    on_disk: int = 0


class MachineMemory(NamedTuple):
    """Bytes of RAM: total, and available now (None where the system does not say)."""
    total: int
    available: int | None


def session_pool_width() -> int:
    """How many session processes of a trial run at once: the CPU cores this process may use.
    A session is one busy process (env steps and torch on one thread by default), so more at once
    than cores only makes each slower while they hold their memory together."""
    return usable_cores()


def machine_memory() -> MachineMemory:
    """Total and available RAM, from /proc/meminfo on Linux, else os.sysconf."""
    try:
        fields = {}
        with open('/proc/meminfo') as f:
            for line in f:
                name, value = line.split(':', 1)
                fields[name] = int(value.split()[0]) * 1024  # reported in kB
        return MachineMemory(fields['MemTotal'], fields.get('MemAvailable'))
    except (OSError, KeyError, ValueError):
        return MachineMemory(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'), None)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, as `free -h` shows them."""
    if isinstance(n, int) and abs(n) >= 2**1000:  # past what a float holds: 1e308 steps x a batch
        return f'2^{abs(n).bit_length() - 1} B'
    for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
        if abs(n) < 1024:
            return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
        n /= 1024
    return f'{n:.1f} PiB' if abs(n) < 1024 else f'{n:.3g} PiB'  # absurd sizes stay readable


def mlp_param_count(in_dim: int, widths: list[int], out_dims: list[int]) -> int:
    """Weights and biases of an MLP in_dim -> widths... -> one linear head per out_dim."""
    count, dim = 0, in_dim
    for width in widths:
        count += dim * width + width
        dim = width
    return count + sum(dim * out + out for out in out_dims)


def kept_on_disk(nbytes: int, rewritten_share: float, meta: dict) -> int:
    """Bytes on disk of a replay of `nbytes` in a session's snapshots: the meta.keep_checkpoints
    kept ones and the one being written before the oldest is pruned; the first holds it whole,
    each of the others the share it writes anew (the rest hard-linked; 1 for arrays written whole)."""
    return round(nbytes * (1 + meta.get('keep_checkpoints', 2) * rewritten_share))


def sessions_at_once(meta: dict) -> int:
    """How many sessions of a trial hold their memory at once: a distributed trial's all (workers
    of one training start together), else a pool of one per core at a time."""
    if meta.get('distributed') and meta['max_session'] > 1:
        return meta['max_session']
    return min(meta['max_session'], session_pool_width())


def check_memory(spec: dict, needs: list[Need], machine: MachineMemory | None = None) -> int:
    """Refuse (SpecError) a spec whose sessions running at once need more memory than the machine
    has in all, naming the estimate, the machine's memory and the key that drives it; warn when it
    exceeds what is available now. Returns the estimate in bytes. `needs`: one session's
    (agent.estimate.estimate_session)."""
    at_once = sessions_at_once(spec['meta'])
    per_session = sum(n.nbytes for n in needs)
    total = per_session * at_once
    machine = machine or machine_memory()
    biggest = max(needs, key=lambda n: n.nbytes)
    sessions = f' x {at_once} sessions at once' if at_once > 1 else ''
    available = f', {format_bytes(machine.available)} available' if machine.available is not None else ''
    where = f'{format_bytes(total)} ({format_bytes(per_session)} per session{sessions}; ' \
            f'{biggest.what} {format_bytes(biggest.nbytes)} from {biggest.key})'
    if total > machine.total:
        fewer = ' (or meta.max_session)' if at_once > 1 else ''
        raise SpecError(f'the spec needs about {where} but this machine has {format_bytes(machine.total)} of memory'
                        f'{available}; make {biggest.key} smaller{fewer}')
    if machine.available is not None and total > machine.available:
        logger.warning(f'the spec needs about {where}, more than the {format_bytes(machine.available)} of memory '
                       'available now; the run may swap or be killed')
    return total


# ---------------------------------------------------------------------------------------------
# meta.snapshot_replay null: the lab decides

def free_disk(path: str | os.PathLike) -> int:
    """Bytes free to this user on the filesystem of `path`, or of its nearest existing parent (a
    run directory not made yet)."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where.parent != where:
        where = where.parent
    return shutil.disk_usage(where).free


def bytes_under(root: str | os.PathLike) -> int:
    """Bytes of the files under `root`, each file once however many hard links it has (snapshots
    share their unchanged replay chunks); 0 when it does not exist."""
    seen, total = set(), 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:  # removed meanwhile
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def decide_snapshot_replay(spec: dict, needs: list[Need], data_dir: str | os.PathLike, trials: int = 1,
                           reclaimable: int = 0, machine: MachineMemory | None = None) -> dict | None:
    """The lab's decision for a spec whose meta.snapshot_replay is null (the default): the
    replays (the agent's Replay or PrioritizedReplay, SIL's replay) go into snapshots, so that a
    resume continues exactly, when both

      memory  the replays of the sessions that run at once, full (max_size transitions, as
              estimate_session counts them), take at most 1/SNAPSHOT_REPLAY_SHARE of the memory
              available now (of the total where the system does not say);
      disk    the replays the run's snapshots keep on disk when full (every session's, of every
              trial of a search, `trials`; each session's kept snapshots and the one being
              written: Need.on_disk) take at most 1/SNAPSHOT_REPLAY_SHARE of the disk free for
              `data_dir`, plus `reclaimable` (a resumed run's own snapshots, which the new
              ones replace).

    Returns the record the saved specs keep as meta.snapshot_replay_auto ({'on', and the bytes
    and limits of both}), and says in one line when it is off; None when meta.snapshot_replay is
    true or false (obeyed as given) or the spec keeps no replay."""
    meta = spec['meta']
    replays = [n for n in needs if n.on_disk]
    if meta.get('snapshot_replay') is not None or not replays:
        return None
    machine = machine or machine_memory()
    room = machine.available if machine.available is not None else machine.total
    record = {'memory_bytes': sum(n.nbytes for n in replays) * sessions_at_once(meta),
              'memory_limit_bytes': room // SNAPSHOT_REPLAY_SHARE,
              'disk_bytes': sum(n.on_disk for n in replays) * meta['max_session'] * trials,
              'disk_limit_bytes': (free_disk(data_dir) + reclaimable) // SNAPSHOT_REPLAY_SHARE}
    record = {'on': record['memory_bytes'] <= record['memory_limit_bytes'] and
              record['disk_bytes'] <= record['disk_limit_bytes'], **record}
    if not record['on']:
        logger.info(snapshot_replay_off_line(record, replays, machine.available is not None))
    return record


def snapshot_replay_off_line(record: dict, replays: list[Need], available: bool = True) -> str:
    """The start-up line of a run whose replays the lab leaves out of snapshots: their size, the
    limit they pass, and the key that keeps them in anyway."""
    sizes = ', '.join(f'{n.what} {format_bytes(n.nbytes)} per session when full ({n.key})' for n in replays)
    over = []
    if record['memory_bytes'] > record['memory_limit_bytes']:
        over.append(f"{format_bytes(record['memory_bytes'])} for the sessions that run at once, above "
                    f"1/{SNAPSHOT_REPLAY_SHARE} of the memory {'available' if available else 'here'} "
                    f"({format_bytes(record['memory_limit_bytes'])})")
    if record['disk_bytes'] > record['disk_limit_bytes']:
        over.append(f"{format_bytes(record['disk_bytes'])} in the snapshots kept on disk, above "
                    f"1/{SNAPSHOT_REPLAY_SHARE} of the free disk ({format_bytes(record['disk_limit_bytes'])})")
    return (f"replays stay out of snapshots, so a resume of this run refills them (approximate): {sizes}; "
            f"{'; '.join(over)}; set meta.snapshot_replay: true to keep them in snapshots anyway, or false to leave "
            'them out without this line')


def replay_in_snapshots(meta: dict) -> bool:
    """Whether a run's replays go into its snapshots: meta.snapshot_replay when it is true or
    false, else the lab's decision (meta.snapshot_replay_auto, made at the run's start and at each
    resume); false for a spec no run settled (an agent built outside a run)."""
    if meta.get('snapshot_replay') is not None:
        return bool(meta['snapshot_replay'])
    return bool((meta.get('snapshot_replay_auto') or {}).get('on'))
