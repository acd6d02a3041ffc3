"""The rows of bench/sb3_side_by_side.py: each an rl-zoo3 config for Stable-Baselines3 and the lab
spec that maps it key by key, and the lab's two columns of each row.

rl-zoo3's hyperparameters are those of github.com/DLR-RM/rl-baselines3-zoo, hyperparams/*.yml
(read at commit 22e3ff2, 2026-04-23): ppo.yml (CartPole-v1, atari; Ant-v4's `mujoco-defaults`
anchor, which its commented-out Hopper-v4 entry names: normalize, SB3's PPO defaults), a2c.yml,
dqn.yml (CartPole-v1, atari), sac.yml (Pendulum-v1; HalfCheetah-v4's `mujoco-defaults`) and
td3.yml; SB3's defaults where rl-zoo3 gives none. The MuJoCo rows run the -v5 envs (gymnasium
1.4's, which the lab pins) where rl-zoo3 names -v4.

The two lab columns of a row:
  lab       the spec file as a user's run of it would train: the keys the file gives, the lab's
            defaults for the rest; the zoo specs name none of the speed opt-ins below.
  lab_fast  the same spec with the lab's documented speed opt-ins (fast_edits): torch options that
            leave the maths as it is and round differently, so a seeded run gives other numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    """One comparison: an rl-zoo3 config for SB3 and the lab spec that maps it.

    sb3_kwargs are what SB3's algorithm class gets; a learning rate, clip range or exploration
    schedule in them runs over rl-zoo3's n_timesteps (full_frames), whatever the run's length, as
    the lab's spec states its schedules in frames: a shortened run is the start of rl-zoo3's.
    lab_edits are -s overrides of the spec that every lab run of the row gets: the departures
    from rl-zoo3 that the short window needs, made in sb3_kwargs too (the spec file keeps rl-zoo3's
    values). frame_stack: an Atari row (SB3: make_atari_env, i.e. AtariWrapper, then VecFrameStack
    of that many frames; CnnPolicy). normalize: rl-zoo3's `normalize: true` (SB3: VecNormalize of
    observations and rewards)."""
    key: str
    algo: str  # SB3's class name
    env_id: str
    n_envs: int
    full_frames: int  # rl-zoo3's n_timesteps
    quick_frames: int  # the default run's length
    window_start: int  # frames/s is measured from this frame to the run's end
    spec_file: str
    spec_name: str
    sb3_kwargs: dict = field(default_factory=dict)
    lab_edits: tuple[str, ...] = ()
    frame_stack: int = 0
    normalize: bool = False

    @property
    def policy(self) -> str:
        """SB3's policy class name."""
        return 'CnnPolicy' if self.frame_stack else 'MlpPolicy'

    @property
    def rollout_frames(self) -> int:
        """Frames of one rollout of an on-policy row (n_steps x n_envs, SB3's default n_steps: PPO
        2048, A2C 5), one vector step (n_envs) for the others."""
        n_steps = self.sb3_kwargs.get('n_steps', {'PPO': 2048, 'A2C': 5}.get(self.algo, 1))
        return n_steps * self.n_envs


ROWS = {
    'ppo': Row('ppo', 'PPO', 'CartPole-v1', 8, 100_000, 100_000, 0,
               'spec/benchmark/ppo/ppo_cartpole_zoo.json', 'ppo_cartpole_zoo',
               dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                    learning_rate='lin_0.001', clip_range='lin_0.2')),
    'a2c': Row('a2c', 'A2C', 'CartPole-v1', 8, 500_000, 100_000, 0,
               'spec/benchmark/a2c/a2c_cartpole_zoo.json', 'a2c_cartpole_zoo', dict(ent_coef=0.0)),
    'dqn': Row('dqn', 'DQN', 'CartPole-v1', 1, 50_000, 50_000, 0,
               'spec/benchmark/dqn/dqn_cartpole_zoo.json', 'dqn_cartpole_zoo',
               dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                    target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                    exploration_final_eps=0.04, policy_kwargs={'net_arch': [256, 256]})),
    'sac': Row('sac', 'SAC', 'Pendulum-v1', 1, 20_000, 3_000, 1_000,
               'spec/benchmark/sac/sac_pendulum_zoo.json', 'sac_pendulum_zoo', dict(learning_rate=1e-3)),
    'td3': Row('td3', 'TD3', 'Pendulum-v1', 1, 20_000, 12_000, 10_000,
               'spec/benchmark/td3/td3_pendulum.json', 'td3_pendulum',
               dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, action_noise='normal_0.1', train_freq=1,
                    gradient_steps=1, learning_rate=1e-3, policy_kwargs={'net_arch': [400, 300]})),
    # rl-zoo3 learns from 10k; the short window learns from 1k on both sides, and is frames 1k-6k
    'sac_cheetah': Row('sac_cheetah', 'SAC', 'HalfCheetah-v5', 1, 1_000_000, 6_000, 1_000,
                       'spec/benchmark/sac/sac_halfcheetah_zoo.json', 'sac_halfcheetah_zoo',
                       dict(learning_starts=1_000, buffer_size=1_000_000, batch_size=256,
                            policy_kwargs={'net_arch': [256, 256]}),
                       lab_edits=('agent.algorithm.training_start_step=1000',)),
    # SB3's PPO defaults (n_steps 2048, batch 64, 10 epochs): 10 rollouts
    'ppo_hopper': Row('ppo_hopper', 'PPO', 'Hopper-v5', 1, 1_000_000, 20_480, 0,
                      'spec/benchmark/ppo/ppo_hopper_zoo.json', 'ppo_hopper_zoo', dict(), normalize=True),
    # 20 rollouts of 128 steps x 8 envs
    'ppo_pong': Row('ppo_pong', 'PPO', 'PongNoFrameskip-v4', 8, 10_000_000, 20_480, 0,
                    'spec/benchmark/ppo/ppo_pong_zoo.json', 'ppo_pong_zoo',
                    dict(n_steps=128, n_epochs=4, batch_size=256, learning_rate='lin_2.5e-4', clip_range='lin_0.1',
                         vf_coef=0.5, ent_coef=0.01),
                    frame_stack=4),
    # rl-zoo3 learns from 100k; here from 1k on both sides, so that the 20k frames train
    'dqn_pong': Row('dqn_pong', 'DQN', 'PongNoFrameskip-v4', 1, 10_000_000, 20_000, 0,
                    'spec/benchmark/dqn/dqn_pong_zoo.json', 'dqn_pong_zoo',
                    dict(buffer_size=100_000, learning_rate=1e-4, batch_size=32, learning_starts=1_000,
                         target_update_interval=1000, train_freq=4, gradient_steps=1, exploration_fraction=0.1,
                         exploration_final_eps=0.01, optimize_memory_usage=False),
                    lab_edits=('agent.algorithm.training_start_step=1000',), frame_stack=4),
}
TOOLS = ('sb3', 'lab', 'lab_fast')  # the columns of a row; lab_fast is the lab with fast_edits


def run_frames(row: Row, full: bool, scale: float) -> int:
    """The length of a run: the window's start plus its (scaled) length, rounded up to whole
    rollouts (Row.rollout_frames), as SB3's learn runs them: an on-policy run ends on an update on
    both sides, so both take the same gradient steps."""
    end = row.full_frames if full else row.quick_frames
    length = max(1, int(round((end - row.window_start) * scale)))
    return row.window_start + math.ceil(length / row.rollout_frames) * row.rollout_frames


# the lab's speed opt-ins, as docs/spec.md and docs/BENCHMARKS.md document them: torch's one-kernel
# Adam, its multi-tensor RMSprop (torch has no fused RMSprop), and the oneDNN linear kernel
FAST_OPTIM = {'Adam': 'fused', 'AdamW': 'fused', 'RMSprop': 'foreach'}
FAST_LINEAR_KERNEL = 'onednn'
# ... on AMD CPUs (where torch's MKL takes its AVX2 path and oneDNN AVX-512), on nets whose hidden
# layers are all this wide or wider: measured faster there on [256, 256] and [400, 300] nets, slower
# on Hopper's [64, 64]; on an Intel Xeon with AMX MKL was as fast or faster (docs/BENCHMARKS.md,
# "The expensive rows")
FAST_ONEDNN_MIN_WIDTH = 128


def amd_cpu() -> bool:
    """Whether this machine's CPU is AMD's (Linux's /proc/cpuinfo vendor_id)."""
    try:
        return 'AuthenticAMD' in Path('/proc/cpuinfo').read_text()
    except OSError:
        return False
# and bfloat16 image nets (net.precision), where this CPU has bf16 instructions
# (precision.cpu_has_bf16): about 2x on the Nature CNN; on the MLPs it measured no faster than
# float32, and autocast takes the products off the oneDNN kernel
FAST_PRECISION = 'bf16'
# bf16 on a wide MLP net pays for its casts on a large batch only: SAC's batch of 256 (HalfCheetah's
# update 24% faster than oneDNN's float32 on the AMD EPYC); DQN CartPole's batch of 64, with acting
# at batch 1 through the same net, ran 1-9% slower in bf16 there (docs/BENCHMARKS.md, 2026-12-07)
FAST_BF16_MIN_BATCH = 128


def _nets(spec: dict):
    """(key path, net spec) of each net a spec gives: agent.net and, where given, agent.critic_net."""
    agent = spec.get('agent') or {}
    for key in ('net', 'critic_net'):
        if isinstance(agent.get(key), dict):
            yield f'agent.{key}', agent[key]


def _optims(net: dict):
    """(key, optimizer spec) of each optimizer a net spec gives."""
    for key in ('optim_spec', 'actor_optim_spec', 'critic_optim_spec'):
        if isinstance(net.get(key), dict):
            yield key, net[key]


def raw_spec(row: Row, edits: list[str] | tuple[str, ...] = ()) -> dict:
    """The row's spec as its file gives it, with these -s overrides (before defaults and validation)."""
    from slm_lab.spec.load import load_raw_spec  # the lab's reader: JSON with trailing commas, ${var}
    return load_raw_spec(str(REPO_ROOT / row.spec_file), row.spec_name, list(edits))


def speed_opt_ins(spec: dict) -> list[str]:
    """The speed opt-ins a raw spec names, as `path=value`: a spec of the default column has none."""
    named = []
    for path, net in _nets(spec):
        if net.get('linear_kernel', 'default') != 'default':
            named.append(f'{path}.linear_kernel={net["linear_kernel"]}')
        if net.get('precision', 'fp32') != 'fp32':
            named.append(f'{path}.precision={net["precision"]}')
        for key, optim in _optims(net):
            named += [f'{path}.{key}.{option}=true' for option in ('fused', 'foreach') if optim.get(option)]
    return named


def fast_edits(row: Row) -> list[str]:
    """The -s overrides that make the row's lab_fast column: on each net of its spec, linear_kernel
    "onednn" on an AMD CPU where the net type takes the key (the MLP-family nets; ConvNet has none)
    and its hidden layers are all at least FAST_ONEDNN_MIN_WIDTH wide, precision "bf16" where this
    CPU computes bf16 in hardware on image nets and, on an AMD CPU, on those wide MLP-family nets
    where the memory's batch is at least FAST_BF16_MIN_BATCH (a SAC HalfCheetah update 24% faster
    there than on oneDNN in float32; on an Intel CPU with AMX no faster, docs/BENCHMARKS.md), and on
    each Adam / AdamW / RMSprop optimizer the option FAST_OPTIM names."""
    from slm_lab.agent.net import IMAGE_NETS, NETS  # here, not at the top: only the lab's columns need torch
    from slm_lab.agent.net.precision import cpu_has_bf16
    edits = []
    spec = raw_spec(row, row.lab_edits)
    batch = ((spec.get('agent') or {}).get('memory') or {}).get('batch_size') or 0
    for path, net in _nets(spec):
        net_class = NETS.get(net.get('type'))
        if net_class is None:
            continue
        wide_mlp = False
        if 'linear_kernel' in net_class.spec_schema and amd_cpu():
            widths = net.get('hid_layers', net_class.spec_schema['hid_layers'].default)
            wide_mlp = bool(widths) and min(widths) >= FAST_ONEDNN_MIN_WIDTH
            if wide_mlp:
                edits.append(f'{path}.linear_kernel={FAST_LINEAR_KERNEL}')
        if (issubclass(net_class, IMAGE_NETS) or (wide_mlp and batch >= FAST_BF16_MIN_BATCH)) \
                and 'precision' in net_class.spec_schema \
                and cpu_has_bf16():
            edits.append(f'{path}.precision={FAST_PRECISION}')
        edits += [f'{path}.{key}.{FAST_OPTIM[optim["name"]]}=true' for key, optim in _optims(net)
                  if optim.get('name') in FAST_OPTIM]
    return edits
