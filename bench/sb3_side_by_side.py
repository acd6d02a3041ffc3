"""The lab and Stable-Baselines3 side by side: frames/s and learning on rl-zoo3's configs.

    pip install -r requirements-bench.txt            # once: stable-baselines3 (bench only)
    python bench/sb3_side_by_side.py                 # 9 rows x seeds 0,1,2 x 3 columns: about 1.5 hours (estimated)
    python bench/sb3_side_by_side.py --rows ppo,a2c --seeds 0,1,2 --cpu 1
    python bench/sb3_side_by_side.py --rows ppo_pong,dqn_pong --seeds 0 --cpu 1 --json /tmp/atari.json
    python bench/sb3_side_by_side.py --frames-scale 0.2 --json /tmp/side.json   # a quick check
    python bench/sb3_side_by_side.py --full --rows a2c,sac,td3   # learning at rl-zoo3's lengths (about 45 minutes)
    python bench/sb3_side_by_side.py --rows ppo --seeds 0 --lab-only --frames-scale 0.005   # no SB3 needed

Each row has three columns: SB3, and the lab twice (bench/side_rows.py):
  lab   ("default") the row's spec as a user's run of it trains: no speed opt-in;
  fast  the same spec with the lab's documented speed opt-ins, applied by the bench as -s edits
        (side_rows.fast_edits, printed per row): `linear_kernel: "onednn"` on each net whose type
        takes the key (MLPNet and its kin, not ConvNet) and whose hidden layers are all at least
        128 wide, on AMD CPUs only, `precision: "bf16"` where the CPU has bf16 instructions on image
        nets and, on AMD CPUs, on those wide MLP nets where the batch is 128 or more, `"fused":
        true` on Adam and AdamW optimizers (their default since issue 29), `"foreach": true` on
        RMSprop. All but bf16 change how torch computes, not what: the results differ in rounding
        only; bf16 rounds the nets' products to bfloat16, so its learning column is the one to
        check (docs/spec.md, docs/BENCHMARKS.md).

Printed: one line per row and seed (each column's frames/s, lab/SB3 and fast/SB3, CPU frames/s,
total seconds, learning); then per row, over its seeds, the median frames/s of each column, the
medians of the per-seed ratios (frames/s and CPU frames/s), the row's floor and each column's median
frames/s as a share of it; then each floor's parts. The floor (bench/floor.py) is the row's env
alone plus its matrix products, counted from its nets and settings, at this CPU's measured
single-thread peak, over the runs' windows (the DQN rows' counts depend on them): measured in a
fresh process after the runs (--no-floor skips it). --json OUT keeps all of it: the rows'
settings and edits, every run, the per-row summary and the floors.

Rows (rl-zoo3's hyperparameters from github.com/DLR-RM/rl-baselines3-zoo hyperparams/*.yml, SB3's
defaults where rl-zoo3 gives none; the lab's spec that maps them key by key is named;
docs/BENCHMARKS.md has the mapping and what the lab cannot express). Frames are agent steps on both
sides, summed over the vector envs (SB3's num_timesteps); an Atari frame is one agent step, 4
emulator frames inside the env on both sides:

    ppo          PPO CartPole-v1, 8 envs, 100k frames    spec/benchmark/ppo/ppo_cartpole_zoo.json ppo_cartpole_zoo
    a2c          A2C CartPole-v1, 8 envs, 500k frames    spec/benchmark/a2c/a2c_cartpole_zoo.json a2c_cartpole_zoo
    dqn          DQN CartPole-v1, 1 env, 50k frames      spec/benchmark/dqn/dqn_cartpole_zoo.json dqn_cartpole_zoo
    sac          SAC Pendulum-v1, 1 env, 20k frames      spec/benchmark/sac/sac_pendulum_zoo.json sac_pendulum_zoo
    td3          TD3 Pendulum-v1, 1 env, 20k frames      spec/benchmark/td3/td3_pendulum.json td3_pendulum
    sac_cheetah  SAC HalfCheetah-v5, 1 env, 1M frames    spec/benchmark/sac/sac_halfcheetah_zoo.json sac_halfcheetah_zoo
    ppo_hopper   PPO Hopper-v5, 1 env, 1M frames         spec/benchmark/ppo/ppo_hopper_zoo.json ppo_hopper_zoo
    ppo_pong     PPO PongNoFrameskip-v4, 8 envs, 10M     spec/benchmark/ppo/ppo_pong_zoo.json ppo_pong_zoo
    dqn_pong     DQN PongNoFrameskip-v4, 1 env, 10M      spec/benchmark/dqn/dqn_pong_zoo.json dqn_pong_zoo

The four expensive rows, as they run here (the frames are rl-zoo3's n_timesteps above):
  sac_cheetah  [256, 256] actor and critics, batch 256, buffer 1M, lr 3e-4, SB3's SAC otherwise;
               rl-zoo3 learns from frame 10k: here both sides learn from 1k (SB3 learning_starts,
               the lab -s agent.algorithm.training_start_step=1000) and frames/s is over frames 1k-6k.
  ppo_hopper   SB3's PPO defaults (n_steps 2048, batch 64, 10 epochs, lr 3e-4, clip 0.2, [64, 64]
               tanh) with rl-zoo3's normalize: true matched on both sides (SB3 VecNormalize of
               observations and rewards; the lab env.normalize_obs and normalize_reward, each
               clipped at 10); 20,480 frames (10 rollouts).
  ppo_pong     8 envs, Nature CNN shared by the policy and the value, n_steps 128, 4 epochs, batch
               256, lr lin_2.5e-4, clip lin_0.1, vf_coef 0.5, ent_coef 0.01, 4 frames stacked (SB3:
               AtariWrapper + VecFrameStack; the lab: frame_op concat of 4, reward sign); 20,480
               frames (20 rollouts). The lab's default vector env for 8 Atari games is ALE's own (its
               games stepped by C++ threads, docs/environments.md), SB3's DummyVecEnv steps 8 Python
               envs in turn: with --cpu both are on one core; without it ALE's threads may take
               another core, which wall-clock frames/s gains from and CPU frames/s (every thread's
               time) does not.
  dqn_pong     Nature CNN, buffer 100k, batch 32, lr 1e-4, train_freq 4, one gradient step, target
               every 1,000 frames, epsilon 1 -> 0.01 over the first 10% of rl-zoo3's 10M frames;
               rl-zoo3 learns from frame 100k: here both sides from 1k (the same edits as
               sac_cheetah), over 20k frames, frames/s from frame 0 (its first 1k random frames
               included; the floor counts them as such).

How it runs. For each row and seed, the three columns run one after the other (the first seed
SB3, lab, fast; the next lab, fast, SB3; and so on), each in a fresh Python process with one torch
thread (torch.set_num_threads(1), OMP_NUM_THREADS and MKL_NUM_THREADS 1) and, with --cpu N, pinned
to core N (os.sched_setaffinity). Both sides take the same gradient steps: the same update cadence,
and a run's length rounded up to whole rollouts for the on-policy rows (as SB3's learn runs them:
PPO CartPole's 100k frames are 391 rollouts of 256, 100,096 frames). Schedules run over rl-zoo3's
n_timesteps on both sides, however long the run (SB3's lin_X and exploration_fraction, which SB3
takes as shares of the learn call, are rescaled to it): a shortened run is the start of rl-zoo3's.

What is measured, the same way on both sides:
  fps          env frames (summed over the vector envs) / wall seconds, over a window of the training
               call: SB3's model.learn, timed by a callback at the window's start (or the call itself
               from frame 0); the lab's Session loop, from its train CSV (`frame`, `wall_t` of the row
               at the window's start, or 0 from frame 0; `wall_t` of the last row). Both include what
               each tool does while it trains: SB3 its logger, the lab its records, model files and
               snapshots at the spec's frequencies (the lab's clock also counts building its agent).
  cpu_fps      the same frames / the CPU seconds of the process over the same window (time.process_time,
               every thread of the process; the lab's loop from Session.run's start, or its log row at
               the window's start, to its last row): the figure to compare on a machine that other work
               shares, where wall time is mostly waiting for a core.
  learning     mean return of the last 100 training episodes (SB3: the Monitor's ep_info_buffer; the
               lab: total_reward_ma of the last train row), exploration included; and, with
               --eval-episodes N (default 10), the mean return of N greedy episodes of the final
               weights on a separate env (SB3: evaluate_policy(deterministic=True), under the
               training's frozen VecNormalize for ppo_hopper; the lab: enjoy with --ckpt latest).
               Atari returns are whole games' scores on both sides.
  total_s      the child process from start to the end of training: imports, setup and training, not
               the greedy evaluation.

The default run is the affordable one: PPO, DQN, ppo_hopper, ppo_pong and dqn_pong at the lengths
above; A2C over its first 100k frames; SAC over 3k frames (speed from frame 1,000, once training has
run 900 steps); TD3 over 12k (speed over frames 10k-12k: it acts at random, without training, until
10k); sac_cheetah over 6k. Learning figures of the shortened rows are those of the short runs (the
printout says so); --full runs every row at rl-zoo3's length (speed windows from 0 for the on-policy
and DQN rows, from 1k for SAC and sac_cheetah, from 10k for TD3): for A2C, SAC and TD3 that is about
45 minutes (estimated: their two-column run took 27); the MuJoCo and Atari rows at 1M and 10M frames
would take days on one core. --frames-scale F
multiplies each window's length (not its start) for a quick check.

Cost: ESTIMATES, not measurements (the three-column bench has run only tiny windows, on a shared
machine), on this project's 2-core VM, per seed and all three columns: PPO ~1 min, A2C ~0.7, DQN
~1.5, SAC ~1.2, TD3 ~1.2 (the two-column default run of these rows took 11 minutes for 3 seeds,
docs/BENCHMARKS.md, 2026-11-25; the default column is taken at SB3's speed where the opt-ins gave
the lab its lead); sac_cheetah ~3 (5k updates counting as many FLOPs as SAC Pendulum's, which ran
at ~100 frames/s in SB3); ppo_hopper ~1.5; ppo_pong ~10 (the lab's PPO on the same net, epochs and
minibatches ran at ~116 frames per CPU second, docs/environments.md); dqn_pong ~10 (a quarter of a
batch-32 update of the CNN per frame, ~520 MFLOP a frame by bench/floor.py). So 3 seeds of the 5
CartPole and Pendulum rows take about 18 minutes, of the 4 expensive rows about 75, of all 9 about
1.5 hours; the floor adds about half a minute. dqn_pong's replay of 100k stacked frames
reserves ~5.6 GB in SB3 (observations and next observations) and ~0.7 GB in the lab, touched as
it fills.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pinning import child_result, python_child  # bench/ (not a package) is on sys.path
from side_rows import REPO_ROOT, ROWS, TOOLS, Row, fast_edits, run_frames

SB3_MISSING = ('stable_baselines3 is not installed in this Python: pip install -r requirements-bench.txt '
               '(bench only), or pass --lab-only')
TOOL_LABELS = {'sb3': 'SB3', 'lab': 'lab', 'lab_fast': 'fast'}


# --- the child processes ---------------------------------------------------------------------------

def _limit_threads(cpu: int | None) -> None:
    """One torch thread (and one core with --cpu) for the child, before torch does any work."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch  # here, after the thread variables are set, so its pools start at one thread
    torch.set_num_threads(1)


def _linear(initial: float, frames: int, full_frames: int):
    """rl-zoo3's lin_X over its n_timesteps (full_frames): X times the share of full_frames left,
    from SB3's progress_remaining over a run of `frames` (the lab's schedules count frames too)."""
    return lambda progress_remaining: initial * max(0.0, 1 - (1 - progress_remaining) * frames / full_frames)


def _sb3_env(row: Row, n_envs: int, seed: int):
    """The row's vector env as rl-zoo3 builds it: make_vec_env, or for Atari make_atari_env
    (AtariWrapper: no-ops, frame skip 4 with max-pooling, life loss, FIRE, 84x84 grey, reward sign)
    and VecFrameStack. VecNormalize (row.normalize) is the caller's."""
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack
    if not row.frame_stack:
        return make_vec_env(row.env_id, n_envs=n_envs, seed=seed)
    import ale_py  # registers the Atari ids with gymnasium, which SB3 does not import
    import gymnasium as gym
    gym.register_envs(ale_py)
    return VecFrameStack(make_atari_env(row.env_id, n_envs=n_envs, seed=seed), n_stack=row.frame_stack)


def sb3_child(row: Row, seed: int, frames: int, eval_episodes: int) -> dict:
    """Train SB3 on the row's config; measure as the module docstring says."""
    import numpy as np
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    kwargs = dict(row.sb3_kwargs)
    for key in ('learning_rate', 'clip_range'):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = _linear(float(kwargs[key][len('lin_'):]), frames, row.full_frames)
    if 'exploration_fraction' in kwargs:  # a share of the run in SB3: of rl-zoo3's n_timesteps here
        kwargs['exploration_fraction'] *= row.full_frames / frames
    env = _sb3_env(row, row.n_envs, seed)
    if row.normalize:  # rl-zoo3's normalize: true, with the algorithm's discount for the rewards
        env = VecNormalize(env, gamma=kwargs.get('gamma', 0.99))
    if kwargs.get('action_noise') == 'normal_0.1':
        n_actions = env.action_space.shape[0]
        kwargs['action_noise'] = NormalActionNoise(np.zeros(n_actions), 0.1 * np.ones(n_actions))
    model = getattr(sb3, row.algo)(row.policy, env, seed=seed, device='cpu', verbose=0, **kwargs)

    class WindowStart(BaseCallback):
        """The time and frame at the first step at or past the window's start."""

        def __init__(self, start: int):
            super().__init__()
            self.start, self.at = start, None

        def _on_step(self) -> bool:
            if self.at is None and self.num_timesteps >= self.start:
                self.at = (self.num_timesteps, time.perf_counter(), time.process_time())
            return True

    callback = WindowStart(row.window_start) if row.window_start else None
    t0, c0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=frames, callback=callback)
    t1, c1 = time.perf_counter(), time.process_time()
    start_frame, start_t, start_c = callback.at if callback else (0, t0, c0)
    returns = [info['r'] for info in model.ep_info_buffer]
    result = {'frames': int(model.num_timesteps), 'window_frames': int(model.num_timesteps) - start_frame,
              'window_s': t1 - start_t, 'window_cpu_s': c1 - start_c, 'train_s': t1 - t0,
              'last100_return': float(np.mean(returns)) if returns else math.nan, 'episodes': len(returns)}
    if eval_episodes:
        t2 = time.perf_counter()
        eval_env = _sb3_env(row, 1, seed + 10**6)
        if row.normalize:  # the training statistics, frozen; the env's own rewards
            eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
            eval_env.obs_rms = env.obs_rms
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True)
        result.update(greedy_return=float(mean), eval_s=time.perf_counter() - t2)
    return result


def lab_child(row: Row, seed: int, frames: int, eval_episodes: int, work_dir: Path, fast: bool) -> dict:
    """Train the lab's spec for the row (one session, this seed; with `fast`, fast_edits too);
    measure from its train CSV."""
    sys.path.insert(0, str(REPO_ROOT))
    sys.path.insert(0, str(REPO_ROOT / 'bench'))
    from benchmark import read_train_rows
    from slm_lab import lab
    from slm_lab.experiment import session, viz
    from slm_lab.experiment.enjoy import enjoy
    viz.png_available = lambda: False  # PNG export (kaleido) is a run's end, not training; HTML graphs stay
    cpu_at: dict[str, float] = {}  # process CPU seconds at the loop's start and end and at each log row
    run, log_row = session.Session.run, session.Session.log_row

    def timed_run(self, *args, **kwargs):
        cpu_at['start'] = time.process_time()
        try:
            return run(self, *args, **kwargs)
        finally:
            cpu_at.setdefault('end', time.process_time())

    def timed_log_row(self, *args, **kwargs):
        log_row(self, *args, **kwargs)
        cpu_at[f'row{self.clock.frame}'] = time.process_time()
        if self.clock.frame >= self.clock.max_frame:
            cpu_at['end'] = time.process_time()  # before the session's final files and graphs

    session.Session.run, session.Session.log_row = timed_run, timed_log_row
    edits = fast_edits(row) if fast else []
    overrides = [f'meta.random_seed={seed}', 'meta.max_session=1', f'env.max_frame={frames}',
                 'meta.torch_num_threads=1', *row.lab_edits, *edits]
    with open(work_dir / 'lab.log', 'a', encoding='utf-8') as log, contextlib.redirect_stderr(log):
        lab.run(str(REPO_ROOT / row.spec_file), row.spec_name, 'train', overrides, data_dir=str(work_dir))
    run_root = next(p for p in work_dir.iterdir() if p.is_dir() and not p.name.startswith('.'))  # not data/.cache
    rows = read_train_rows(run_root)
    last = rows[-1]
    start = next((r for r in rows if r['frame'] >= row.window_start), None) if row.window_start else None
    start_frame, start_t = (start['frame'], start['wall_t']) if start else (0, 0.0)
    start_c = cpu_at[f'row{int(start_frame)}'] if start else cpu_at['start']
    ma = last['total_reward_ma']
    result = {'frames': int(last['frame']), 'window_frames': int(last['frame'] - start_frame),
              'window_s': last['wall_t'] - start_t, 'window_cpu_s': cpu_at['end'] - start_c, 'train_s': last['wall_t'],
              'last100_return': ma, 'episodes': int(last['epi']), 'edits': [*row.lab_edits, *edits]}
    if eval_episodes:
        t2 = time.perf_counter()
        spec_path = run_root / f'{row.spec_name}_t0_s0_spec.json'
        with open(os.devnull, 'w') as devnull, contextlib.redirect_stdout(devnull):
            returns = enjoy(str(spec_path), episodes=eval_episodes, ckpt='latest')
        result.update(greedy_return=float(sum(returns) / len(returns)), eval_s=time.perf_counter() - t2)
    return result


def child_main(args: argparse.Namespace) -> int:
    _limit_threads(args.cpu)
    row = ROWS[args.rows[0]]
    with tempfile.TemporaryDirectory(prefix='sb3_side_') as tmp:
        if args.child == 'sb3':
            result = sb3_child(row, args.seed, args.frames, args.eval_episodes)
        else:
            result = lab_child(row, args.seed, args.frames, args.eval_episodes, Path(tmp), args.child == 'lab_fast')
    result['fps'] = result['window_frames'] / result['window_s'] if result['window_s'] > 0 else math.nan
    cpu_s = result['window_cpu_s']
    result['cpu_fps'] = result['window_frames'] / cpu_s if cpu_s > 0 else math.nan
    print('RESULT ' + json.dumps(result), flush=True)
    return 0


# --- the parent: interleave, print ------------------------------------------------------------------

@dataclass
class Measured:
    """One child's figures (see the module docstring)."""
    tool: str  # one of TOOLS
    row: str
    seed: int
    frames: int
    fps: float
    cpu_fps: float
    window_frames: int
    train_s: float
    total_s: float
    last100_return: float
    episodes: int
    greedy_return: float = math.nan
    edits: list[str] = field(default_factory=list)  # the lab's -s edits of its spec (row's and fast)


def run_child(tool: str, row: Row, seed: int, frames: int, args: argparse.Namespace) -> Measured:
    """One training in a fresh process; its figures, or SystemExit with the child's last lines."""
    cmd = python_child(__file__, '--child', tool, '--rows', row.key, '--seed', str(seed), '--frames', str(frames),
                       '--eval-episodes', str(args.eval_episodes))
    if args.cpu is not None:
        cmd += ['--cpu', str(args.cpu)]
    r = child_result(cmd, f'the {tool} run of {row.key} seed {seed}')
    return Measured(tool, row.key, seed, r['frames'], r['fps'], r['cpu_fps'], r['window_frames'], r['train_s'],
                    r['child_s'] - r.get('eval_s', 0.0), r['last100_return'], r['episodes'],
                    r.get('greedy_return', math.nan), r.get('edits', []))


def _fmt(x: float | None, digits: int = 0) -> str:
    return '-' if x is None or (isinstance(x, float) and math.isnan(x)) else f'{x:,.{digits}f}'


def _ratio(ours: float | None, sb3: float | None) -> float:
    """ours / sb3, NaN where either is missing."""
    if ours is None or sb3 is None or math.isnan(ours) or math.isnan(sb3) or sb3 <= 0:
        return math.nan
    return ours / sb3


def _times(x: float) -> str:
    return '-' if math.isnan(x) else f'{x:.2f}x'


def _share(x: float) -> str:
    return '-' if math.isnan(x) else f'{x:.1%}'


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def _learning(m: Measured | None) -> str:
    if m is None:
        return '-'
    text = _fmt(m.last100_return, 1)
    return text if math.isnan(m.greedy_return) else f'{text} / {_fmt(m.greedy_return, 1)}'


def _aligned(head: list[str], lines: list[list[str]], left: tuple[int, ...]) -> str:
    """A plain-text table: columns in `left` aligned left, the others right, a rule under the head."""
    rows = [head] + lines
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    out = ['  '.join(c.ljust(w) if j in left else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths)))
           for r in rows]
    out.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(out)


def _by_row_and_seed(results: list[Measured]) -> dict[tuple[str, int], dict[str, Measured]]:
    pairs: dict[tuple[str, int], dict[str, Measured]] = {}
    for m in results:
        pairs.setdefault((m.row, m.seed), {})[m.tool] = m
    return pairs


def format_runs(results: list[Measured]) -> str:
    """One line per row and seed: each tool's frames/s, the lab's two columns against SB3's, CPU
    frames/s, total seconds and learning."""
    labels = [TOOL_LABELS[t] for t in TOOLS]
    head = (['row', 'seed', 'frames'] + [f'{x} fps' for x in labels] + ['lab/SB3', 'fast/SB3']
            + [f'{x} cpu_fps' for x in labels] + [f'{x} total_s' for x in labels] + [f'{x} learning' for x in labels])
    lines = []
    for (row, seed), tools in _by_row_and_seed(results).items():
        runs = [tools.get(t) for t in TOOLS]
        sb3 = tools.get('sb3')
        frames = next(m for m in runs if m is not None).frames
        lines.append([row, str(seed), f'{frames:,}'] + [_fmt(m.fps if m else None) for m in runs]
                     + [_times(_ratio(tools[t].fps if t in tools else None, sb3.fps if sb3 else None))
                        for t in ('lab', 'lab_fast')]
                     + [_fmt(m.cpu_fps if m else None) for m in runs]
                     + [_fmt(m.total_s if m else None, 1) for m in runs]
                     + [_learning(m) for m in runs])
    learning = len(head) - len(labels)
    return _aligned(head, lines, left=(0, *range(learning, len(head))))


def summarize(results: list[Measured], floors: dict[str, dict] | None) -> list[dict]:
    """Per row, over its seeds: each tool's median frames/s, the median of the lab's per-seed ratios
    to SB3 (frames/s and CPU frames/s), and, with `floors` (bench/floor.py's, by row), the floor
    and each tool's median frames/s as a share of it."""
    summary = []
    by_row: dict[str, list[dict[str, Measured]]] = {}
    for (row, _), tools in _by_row_and_seed(results).items():
        by_row.setdefault(row, []).append(tools)
    for row, seeds in by_row.items():
        floor = (floors or {}).get(row)
        entry = {'row': row, 'seeds': len(seeds), 'floor_fps': floor['fps'] if floor else math.nan}
        for tool in TOOLS:
            fps = _median([s[tool].fps for s in seeds if tool in s])
            entry[f'{tool}_fps'] = fps
            entry[f'{tool}_of_floor'] = fps / floor['fps'] if floor else math.nan
            if tool != 'sb3':
                entry[f'{tool}_vs_sb3'] = _median([_ratio(s[tool].fps, s['sb3'].fps)
                                                   for s in seeds if tool in s and 'sb3' in s])
                entry[f'{tool}_cpu_vs_sb3'] = _median([_ratio(s[tool].cpu_fps, s['sb3'].cpu_fps)
                                                       for s in seeds if tool in s and 'sb3' in s])
        summary.append(entry)
    return summary


def format_summary(summary: list[dict]) -> str:
    """One line per row: the medians of `summarize`."""
    head = ['row', 'seeds', 'SB3 fps', 'lab fps', 'fast fps', 'lab/SB3', 'fast/SB3', 'cpu lab/SB3', 'cpu fast/SB3',
            'floor fps', 'SB3 of floor', 'lab of floor', 'fast of floor']
    lines = [[e['row'], str(e['seeds'])] + [_fmt(e[f'{t}_fps']) for t in TOOLS]
             + [_times(e['lab_vs_sb3']), _times(e['lab_fast_vs_sb3']), _times(e['lab_cpu_vs_sb3']),
                _times(e['lab_fast_cpu_vs_sb3']), _fmt(e['floor_fps'])]
             + [_share(e[f'{t}_of_floor']) for t in TOOLS] for e in summary]
    return _aligned(head, lines, left=(0,))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='bench/sb3_side_by_side.py', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', default=','.join(ROWS), type=lambda s: [k.strip() for k in s.split(',') if k.strip()],
                        help=f'comma-separated rows (default all: {",".join(ROWS)})')
    parser.add_argument('--seeds', default='0,1,2', type=lambda s: [int(k) for k in s.split(',') if k.strip()],
                        help='comma-separated seeds (default 0,1,2)')
    parser.add_argument('--frames-scale', type=float, default=1.0, metavar='F',
                        help='multiply the length of each speed window (not its start) by F, e.g. 0.2')
    parser.add_argument('--full', action='store_true',
                        help="every row at rl-zoo3's full length (learning too; days for the MuJoCo and Atari rows)")
    parser.add_argument('--cpu', type=int, metavar='N', help='pin each run to core N')
    parser.add_argument('--eval-episodes', type=int, default=10, metavar='N',
                        help='greedy episodes of the final weights per run (0: none; default 10)')
    parser.add_argument('--lab-only', action='store_true', help="run only the lab's two columns (no SB3 needed)")
    parser.add_argument('--sb3-only', action='store_true', help='run only the SB3 side')
    parser.add_argument('--json', metavar='OUT', help='also write every figure to OUT as JSON')
    parser.add_argument('--no-floor', action='store_true',
                        help="skip measuring each row's floor (bench/floor.py) for the summary")
    parser.add_argument('--child', choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument('--seed', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--frames', type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [k for k in args.rows if k not in ROWS]
    if unknown or not args.rows:
        parser.error(f'--rows: unknown {", ".join(unknown) or "(none given)"}; choose from {", ".join(ROWS)}')
    if not args.seeds:
        parser.error('--seeds: give at least one seed, e.g. --seeds 0,1,2')
    if args.frames_scale <= 0:
        parser.error('--frames-scale must be > 0')
    if args.lab_only and args.sb3_only:
        parser.error('--lab-only and --sb3-only exclude each other')
    return args


def _row_line(row: Row, args: argparse.Namespace, tools: tuple[str, ...]) -> str:
    """The row's header line: what runs, and the lab's -s edits of its two columns."""
    frames = run_frames(row, args.full, args.frames_scale)
    partial = (f" of rl-zoo3's {row.full_frames:,} (learning figures are of this shortened run)"
               if frames < row.full_frames else '')
    line = (f'# {row.key}: {row.algo} {row.env_id} x{row.n_envs}, {frames:,} frames{partial}, '
            f'fps from frame {row.window_start:,}')
    if row.lab_edits and 'lab' in tools:
        line += f'; both lab columns -s {" -s ".join(row.lab_edits)}'
    if 'lab_fast' in tools:
        line += f'; fast -s {" -s ".join(fast_edits(row))}'
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child_main(args)
    if not args.lab_only and importlib.util.find_spec('stable_baselines3') is None:
        print(f'error: {SB3_MISSING}', file=sys.stderr)
        return 2
    tools = ('lab', 'lab_fast') if args.lab_only else ('sb3',) if args.sb3_only else TOOLS
    rows = [ROWS[k] for k in args.rows]
    print(f'# {time.strftime("%Y-%m-%d %H:%M %Z")} | {os.cpu_count()} CPU cores | one torch thread per run'
          f'{f" | pinned to core {args.cpu}" if args.cpu is not None else ""} | '
          f'{"full lengths" if args.full else "default lengths"} | frames scale {args.frames_scale:g} | '
          f'greedy episodes {args.eval_episodes}', flush=True)
    for row in rows:
        print(_row_line(row, args, tools), flush=True)
    results: list[Measured] = []
    try:
        for row in rows:
            frames = run_frames(row, args.full, args.frames_scale)
            for i, seed in enumerate(args.seeds):
                order = tools[i % len(tools):] + tools[:i % len(tools)]  # each tool first in turn
                for tool in order:
                    m = run_child(tool, row, seed, frames, args)
                    results.append(m)
                    print(f'done {TOOL_LABELS[tool]} {row.key} seed {seed}: {m.frames:,} frames, fps {_fmt(m.fps)} '
                          f'over {m.window_frames:,} frames, last-100 return {_fmt(m.last100_return, 1)}, greedy '
                          f'{_fmt(m.greedy_return, 1)}, total {m.total_s:.1f} s', flush=True)
    finally:
        if results:
            report(args, rows, tools, results)
    return 0


def report(args: argparse.Namespace, rows: list[Row], tools: tuple[str, ...], results: list[Measured]) -> None:
    """The tables (runs; per row medians against SB3 and the floor), the floors' parts, and --json."""
    done = [row for row in rows if any(m.row == row.key for m in results)]
    floors, floor_text = (None, '') if args.no_floor else measure_floors(args, [row.key for row in done])
    summary = summarize(results, floors)
    print()
    print('learning: mean return of the last 100 training episodes / of the greedy episodes')
    print(format_runs(results))
    print()
    print("per row, over its seeds: median frames/s, median of the per-seed ratios, and each tool's median "
          "frames/s as a share of the row's floor (bench/floor.py: the env alone + the products at this CPU's peak)")
    print(format_summary(summary))
    if floor_text:
        print()
        print(floor_text, flush=True)
    if args.json:
        from slm_lab.lib.io import atomic_write_text  # the lab's atomic write (slm_lab is on the path by now)
        meta = {'date': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'cpu_count': os.cpu_count(), 'cpu': args.cpu,
                'full': args.full, 'frames_scale': args.frames_scale, 'eval_episodes': args.eval_episodes,
                'rows': {row.key: {'algo': row.algo, 'env_id': row.env_id, 'n_envs': row.n_envs,
                                   'frames': run_frames(row, args.full, args.frames_scale),
                                   'window_start': row.window_start, 'spec': f'{row.spec_file}:{row.spec_name}',
                                   'sb3_kwargs': row.sb3_kwargs, 'lab_edits': list(row.lab_edits),
                                   'fast_edits': fast_edits(row) if 'lab_fast' in tools else None}
                         for row in done}}
        figures = {'meta': meta, 'runs': [asdict(m) for m in results], 'summary': summary,
                   'floors': list((floors or {}).values())}
        atomic_write_text(args.json, json.dumps(json_safe(figures), indent=1, allow_nan=False))


def json_safe(value):
    """`value` with each NaN or infinite float (a figure not measured: no SB3 column, no floor)
    as None, so --json writes standard JSON (null) that any reader parses, not Python's NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def measure_floors(args: argparse.Namespace, row_keys: list[str]) -> tuple[dict[str, dict] | None, str]:
    """bench/floor.py's floors of these rows, measured in a fresh process of one thread on the same
    core (by row), and its lines (the floor's parts); (None, why) when it failed."""
    with tempfile.TemporaryDirectory(prefix='slm_side_') as tmp:
        out = Path(tmp, 'floors.json')
        cmd = [sys.executable, str(Path(__file__).resolve().parent / 'floor.py'), '--rows', ','.join(row_keys),
               '--json', str(out), '--frames-scale', str(args.frames_scale)] + (['--full'] if args.full else [])
        cmd += ['--cpu', str(args.cpu)] if args.cpu is not None else []
        env = {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT)
        if done.returncode != 0:
            return None, 'floor not measured: ' + ((done.stderr or done.stdout).strip().splitlines() or ['?'])[-1]
        floors = {f['row']: f for f in json.loads(out.read_text())}
    return floors, "each row's floor (bench/floor.py):\n" + done.stdout.strip()


if __name__ == '__main__':
    sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
