"""The floor of each side-by-side row: how fast its training could go on this CPU at best.

    python bench/floor.py                          # every row of bench/sb3_side_by_side.py, one thread
    python bench/floor.py --rows ppo,dqn --cpu 1   # pinned to core 1, as the side-by-side runs are
    python bench/floor.py --side side.json         # and each tool's measured frames/s as a share of it
    python bench/floor.py --rows dqn_pong --frames-scale 0.1   # over the window of a run at that scale

A row's floor is the time of its work that neither tool can avoid, per env frame:
  env          the row's gymnasium env alone (gymnasium.make_vec, sync, the row's number of envs,
               actions drawn ahead at random), measured here;
  compute      the matrix products of acting and training, counted from the row's nets and
               rl-zoo3's hyperparameters (FLOPS_PER_FRAME below: 2 FLOPs per multiply-add), run at
               this CPU's measured single-thread peak (`peak_gflops`: the best of torch's MKL and
               oneDNN products of 256x400x300 and 1024x1024x1024).
floor fps = 1 / (env seconds + compute seconds per frame). Everything else a training does
(elementwise work, the optimizer, the replay buffer, Python and torch's per-call costs, records)
is above the floor, so no implementation reaches it; the figure says how much room is left: a tool
at 10% of the floor spends 90% of its time on that.

The counts (multiply-adds per sample of a net = the sum over its layers: in x out for a linear
layer, out_h x out_w x out_channels x in_channels x kernel^2 for a convolution; a training pass
forward and backward = 3 forward passes: the backward has the input and the weight gradient
products; a pass that needs only the input's gradient, through a critic to the action, = 2), with
rl-zoo3's settings of bench/side_rows.py. The MLP counts keep the first layer's input gradient,
which torch skips (the observation needs none): a few percent of those nets (the SAC and TD3 counts
still agree with the profiler's within 0.5%, below). The Nature CNN's leave it out (its first
convolution is a third of a forward pass), so a CNN training pass is 3 F - L1 (F the forward, L1
its first layer):
  ppo  actor 4-64-64-2 and critic 4-64-64-1 (A + C = 8,896): acting A + C per frame; training
       n_epochs 20 passes over each frame, 3 (A + C) each: 61 (A + C) per frame.
  a2c  the same nets; one pass over each frame: 4 (A + C) per frame.
  dqn  Q 4-256-256-2 (Q = 67,072); acting Q on the frames that act greedily (the share 1 - epsilon
       of epsilon-greedy's schedule, averaged over the window: both tools skip the net on a
       random step); on the frames past learning_starts (1,000), gradient_steps / train_freq =
       128 / 256 updates per frame of batch 64, each 3 Q (online) + Q (target) per sample.
  sac  actor 3-256-256-2 (A = 66,816), critics 4-256-256-1 (C = 66,816 each); acting A; per frame
       one update of batch 256: critic loss A + 2 C (targets) + 2 x 3 C, actor loss 3 A + 2 x 2 C.
  td3  actor 3-400-300-1 (A = 121,500), critics 4-400-300-1 (C = 121,900); acting A; per frame one
       critic update of batch 256, A + 2 C (targets) + 2 x 3 C, and every 2nd frame (policy_delay)
       an actor update 3 A + 2 C (critic 1 only).
  sac_cheetah  as sac with HalfCheetah's 17 observations and 6 actions: actor 17-256-256-12 (the
       mean and log std of each action), critics 23-256-256-1.
  ppo_hopper  as ppo with Hopper's 11 observations and 3 actions (actor 11-64-64-3: the mean; the
       log std is a parameter) and SB3's 10 epochs: 31 (A + C) per frame.
  ppo_pong  the Nature CNN on 4 stacked 84x84 frames (convolutions 32 8x8 /4, 64 4x4 /2, 64 3x3 /1,
       then 3136-512: 3,276,800 + 2,654,208 + 1,806,336 + 1,605,632 multiply-adds), shared by a
       policy head 512-6 and a value head 512-1 (F = 9,346,560); acting F per frame; training
       n_epochs 4 passes over each frame, 3 F - L1 each.
  dqn_pong  Q = the Nature CNN and a head 512-6 (F = 9,346,048); acting as dqn; on the frames past
       learning_starts (1,000 of the 20,000), train_freq 4, gradient_steps 1: a quarter of an update
       of batch 32 per frame, each (3 F - L1) online + F target per sample.
The DQN rows' counts depend on the window (their shares of greedy and of training frames): by
default that of the side-by-side's default run; --full and --frames-scale give those of its other
runs (the side-by-side passes its own).
The env of an Atari row is the game under gymnasium's AtariPreprocessing (30 no-ops at most, frame
skip 4 with the last two frames max-pooled, 84x84 grey) and FrameStackObservation(4): what both
tools' wrappers do to each frame, one Python env per game (the lab's default for 8 games, ALE's
own vector env, steps them in C++ threads: faster than this floor's env on the same core).
The SAC and TD3 counts agree with torch.profiler(with_flops=True) over the lab's updates (546 and
715 MFLOP per update, docs/BENCHMARKS.md "Off-policy speed"); test/test_sb3_side_by_side.py checks
the DQN and the Nature CNN counts against the profiler.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_rows import ROWS, Row, run_frames  # noqa: E402  (bench/ is not a package)


def macs(*widths: int) -> int:
    """Multiply-adds per sample of an MLP with these layer widths (input first)."""
    return sum(a * b for a, b in zip(widths, widths[1:]))


NATURE_CNN = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (out channels, kernel, stride) of each convolution
NATURE_FC = 512
_ATARI_ACTIONS = {'PongNoFrameskip-v4': 6}  # the game's minimal action set, both tools' default


def nature_cnn_macs(in_channels: int = 4, size: int = 84) -> list[int]:
    """Multiply-adds per sample of each layer of the Nature CNN (Mnih et al. 2015, SB3's NatureCNN,
    the lab's default ConvNet without batch norm) on (in_channels, size, size): its three
    convolutions (no padding) and its dense layer of 512."""
    layers, channels = [], in_channels
    for out, kernel, stride in NATURE_CNN:
        size = (size - kernel) // stride + 1
        layers.append(size * size * out * channels * kernel * kernel)
        channels = out
    return layers + [size * size * channels * NATURE_FC]


def cnn_train_pass(layers: list[int]) -> int:
    """Multiply-adds of one sample's training pass through a CNN: forward, weight gradients, and
    input gradients of every layer but the first (the observation needs none): 3 F - L1."""
    return 3 * sum(layers) - layers[0]


def _ppo_like(obs: int, actions: int, passes: int) -> float:
    actor_critic = macs(obs, 64, 64, actions) + macs(obs, 64, 64, 1)
    return 2.0 * actor_critic * (1 + 3 * passes)


def _ppo_cnn(row: Row) -> float:
    body = nature_cnn_macs(row.frame_stack)
    heads = NATURE_FC * (_ATARI_ACTIONS[row.env_id] + 1)
    layers = body[:-1] + [body[-1] + heads]  # the heads join the dense layer's count: one forward F
    return 2.0 * (sum(layers) + row.sb3_kwargs['n_epochs'] * cnn_train_pass(layers))


def greedy_share(row: Row, end: int | None = None, points: int = 1000) -> float:
    """The share of the window's frames (row.window_start to `end`, by default the default run's
    end) on which epsilon-greedy acts greedily, 1 - epsilon averaged over the window (SB3's
    schedule: epsilon from 1 to exploration_final_eps over exploration_fraction of rl-zoo3's
    n_timesteps, the lab's spec the same in frames)."""
    kw = row.sb3_kwargs
    final, decay = kw['exploration_final_eps'], kw['exploration_fraction'] * row.full_frames
    start, end = row.window_start, end or row.quick_frames
    frames = (start + (end - start) * (i + 0.5) / points for i in range(points))
    return statistics.fmean(1 - max(final, 1 - (1 - final) * f / decay) for f in frames)


def training_share(row: Row, end: int | None = None) -> float:
    """The share of the window's frames (row.window_start to `end`, by default the default run's
    end) past learning_starts (the off-policy rows train from there)."""
    start, end = row.window_start, end or row.quick_frames
    return (end - max(start, row.sb3_kwargs.get('learning_starts', 0))) / (end - start)


def _dqn(row: Row, end: int | None) -> float:
    kw = row.sb3_kwargs
    if row.frame_stack:
        layers = nature_cnn_macs(row.frame_stack)
        layers[-1] += NATURE_FC * _ATARI_ACTIONS[row.env_id]
        q, train = sum(layers), cnn_train_pass(layers)
    else:
        q = macs(4, 256, 256, 2)
        train = 3 * q
    updates_per_frame = kw['gradient_steps'] / kw['train_freq']
    return 2.0 * (greedy_share(row, end) * q
                  + training_share(row, end) * updates_per_frame * kw['batch_size'] * (train + q))


def _sac(obs: int, actions: int) -> float:
    a, c = macs(obs, 256, 256, 2 * actions), macs(obs + actions, 256, 256, 1)
    return 2.0 * (a + 256 * ((a + 2 * c + 6 * c) + (3 * a + 4 * c)))


def _td3() -> float:
    a, c = macs(3, 400, 300, 1), macs(4, 400, 300, 1)
    return 2.0 * (a + 256 * ((a + 2 * c + 6 * c) + (3 * a + 2 * c) / 2))


# per row: FLOPs per frame of its window, from row.window_start to a frame (the DQN rows' shares of
# greedy and training frames depend on it; the others' windows train throughout)
FLOPS_PER_FRAME = {'ppo': lambda row, end: _ppo_like(4, 2, row.sb3_kwargs['n_epochs']),
                   'a2c': lambda row, end: _ppo_like(4, 2, 1),
                   'dqn': _dqn, 'sac': lambda row, end: _sac(3, 1), 'td3': lambda row, end: _td3(),
                   'sac_cheetah': lambda row, end: _sac(17, 6),
                   'ppo_hopper': lambda row, end: _ppo_like(11, 3, row.sb3_kwargs.get('n_epochs', 10)),  # SB3's default
                   'ppo_pong': lambda row, end: _ppo_cnn(row), 'dqn_pong': _dqn}


def flops_per_frame(row: Row, end: int | None = None) -> float:
    """FLOPs per frame of the row's products over its window, from row.window_start to `end`
    (default: the default run's end)."""
    return FLOPS_PER_FRAME[row.key](row, end)


def limit_threads(cpu: int | None) -> None:
    """One torch thread (and one core with `cpu`), as the side-by-side runs have."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    os.environ.setdefault('MKL_NUM_THREADS', '1')
    import torch
    torch.set_num_threads(1)


def peak_gflops(rounds: int = 7) -> float:
    """This CPU's single-thread fp32 product speed: the best round of MKL (torch.mm) and of oneDNN
    (torch.ops.mkldnn._linear_pointwise, where this build has it) over two shapes."""
    import torch
    onednn = getattr(torch.ops.mkldnn, '_linear_pointwise', None) if torch.backends.mkldnn.is_available() else None
    best = 0.0
    for m, k, n, calls in ((256, 400, 300, 20), (1024, 1024, 1024, 2)):
        x, w = torch.randn(m, k), torch.randn(n, k)
        kernels = [lambda: torch.mm(x, w.t())]
        if onednn is not None:
            kernels.append(lambda: onednn(x, w, None, 'none', [], ''))
        for kernel in kernels:
            kernel()
            for _ in range(rounds):
                t = time.perf_counter()
                for _ in range(calls):
                    kernel()
                best = max(best, 2.0 * m * k * n * calls / (time.perf_counter() - t) / 1e9)
    return best


def _make_vec_env(row: Row):
    """The row's env alone as a sync gymnasium vector env: an Atari row's game under the
    preprocessing both tools apply (see the module docstring)."""
    import gymnasium as gym
    wrappers = None
    if row.frame_stack:
        import ale_py  # registers the Atari ids
        gym.register_envs(ale_py)
        wrappers = [lambda env: gym.wrappers.FrameStackObservation(
            gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84), row.frame_stack)]
    return gym.make_vec(row.env_id, num_envs=row.n_envs, vectorization_mode='sync', wrappers=wrappers,
                        vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP})


def env_seconds_per_frame(row: Row, frames: int | None = None, seed: int = 0) -> float:
    """The row's env alone: seconds per frame of gymnasium's sync vector env under random actions
    (the same autoreset as the lab's vector envs: in the same step), over `frames` frames
    (default 20,000; 5,000 for an Atari row, each frame 4 of the emulator's)."""
    env = _make_vec_env(row)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    frames = frames or (5_000 if row.frame_stack else 20_000)
    steps = max(1, frames // row.n_envs)
    actions = [env.action_space.sample() for _ in range(min(steps, 1000))]
    for a in actions[:50]:  # warm up
        env.step(a)
    t = time.perf_counter()
    for i in range(steps):
        env.step(actions[i % len(actions)])
    elapsed = time.perf_counter() - t
    env.close()
    return elapsed / (steps * row.n_envs)


@dataclass
class Floor:
    """A row's floor: its env's measured time and its counted products per frame, at this CPU's peak."""
    row: str
    env_us: float  # per frame
    mflop: float  # per frame
    peak_gflops: float

    @property
    def compute_us(self) -> float:
        return self.mflop * 1e3 / self.peak_gflops

    @property
    def fps(self) -> float:
        return 1e6 / (self.env_us + self.compute_us)


def measure(rows: list[Row], peak: float | None = None, full: bool = False, scale: float = 1.0) -> list[Floor]:
    """Each row's floor over the window of a run of run_frames(row, full, scale), as the side-by-side runs it."""
    peak = peak or peak_gflops()
    return [Floor(row.key, env_seconds_per_frame(row) * 1e6, flops_per_frame(row, run_frames(row, full, scale)) / 1e6,
                  peak) for row in rows]


def format_floors(floors: list[Floor], side: dict | None = None) -> str:
    """One line per row: the floor and its parts; with `side` (sb3_side_by_side.py's --json),
    each tool's median frames/s over its seeds as a share of the floor, and 2x SB3's."""
    by_tool: dict[tuple[str, str], list[float]] = {}
    for run in (side or {}).get('runs', []):
        by_tool.setdefault((run['row'], run['tool']), []).append(run['fps'])
    lines = []
    for f in floors:
        line = (f'{f.row}: floor {f.fps:,.0f} fps = env {f.env_us:.1f} us + compute {f.compute_us:.1f} us per frame '
                f'({f.mflop:.3g} MFLOP at {f.peak_gflops:.0f} GFLOP/s)')
        for tool, label in (('lab', 'lab'), ('lab_fast', 'lab fast')):
            if by_tool.get((f.row, tool)):
                fps = statistics.median(by_tool[(f.row, tool)])
                line += f' | {label} {fps:,.0f} fps = {fps / f.fps:.1%} of the floor'
        sb3 = by_tool.get((f.row, 'sb3'))
        if sb3:
            line += (f' | SB3 {statistics.median(sb3):,.0f} fps = {statistics.median(sb3) / f.fps:.1%}; '
                     f'2x SB3 = {2 * statistics.median(sb3) / f.fps:.1%}')
        lines.append(line)
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='bench/floor.py', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', default=','.join(ROWS), type=lambda s: [k.strip() for k in s.split(',') if k.strip()],
                        help=f'comma-separated rows (default all: {",".join(ROWS)})')
    parser.add_argument('--cpu', type=int, metavar='N', help='pin to core N')
    parser.add_argument('--side', metavar='JSON', help="sb3_side_by_side.py's --json output: compare its frames/s")
    parser.add_argument('--json', metavar='OUT', help='also write the floors to OUT as JSON (a list, one per row)')
    parser.add_argument('--full', action='store_true', help="the windows of bench/sb3_side_by_side.py's --full runs")
    parser.add_argument('--frames-scale', type=float, default=1.0, metavar='F',
                        help="the windows of bench/sb3_side_by_side.py's runs at --frames-scale F")
    args = parser.parse_args(argv)
    unknown = [k for k in args.rows if k not in ROWS]
    if unknown or not args.rows:
        parser.error(f'--rows: unknown {", ".join(unknown) or "(none given)"}; choose from {", ".join(ROWS)}')
    side = None
    if args.side:
        try:
            side = json.loads(Path(args.side).read_text())
        except (OSError, ValueError) as e:
            parser.error(f'--side {args.side}: not a side-by-side JSON file ({e})')
    limit_threads(args.cpu)
    floors = measure([ROWS[k] for k in args.rows], full=args.full, scale=args.frames_scale)
    print(f'# {time.strftime("%Y-%m-%d %H:%M %Z")} | one thread{f", core {args.cpu}" if args.cpu is not None else ""}')
    print(format_floors(floors, side))
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(f), 'compute_us': f.compute_us, 'fps': f.fps}
                                               for f in floors], indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
