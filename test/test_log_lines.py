"""What the lab prints that must not read as something else: a log line before the first update
(loss '-', not nan, which reads as divergence), a schedule that ended with the old run (it stays,
no 'x -> x'), and SDL's own complaint when a replay renders (it looked like the lab's error line)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
from lab_helpers import PPO, cli, lab_env, write_spec

from slm_lab.persistence.edits import describe_schedule_change, schedule_changes


@pytest.mark.slow
def test_a_log_line_before_the_first_update_prints_loss_dash_not_nan(lab_run):
    spec = {**PPO, 'env': {**PPO['env'], 'max_frame': 256}, 'meta': {**PPO['meta'], 'log_frequency': 64}}
    _, run_dir = lab_run(spec, 'early')
    lines = [x for x in (run_dir / 'log' / 'early_t0_s0.log').read_text().splitlines() if '| loss ' in x]
    # PPO updates every time_horizon 32 x 4 envs = 128 frames: the row at frame 64 has no update yet
    assert 'frame 64/256' in lines[0] and '| loss - |' in lines[0], lines[0]
    assert not any('loss nan' in x for x in lines)
    assert '| loss - |' not in lines[-1]


def test_a_schedule_that_ended_with_the_old_run_says_it_stays_without_an_arrow():
    # the demo's clip_eps: 0.2 to 1e-8 over the run's 100k frames, then the run extended to 200k
    piece = {'name': 'linear_decay', 'start_val': 0.2, 'end_val': 1e-8, 'start_step': 0, 'end_step': 100000}
    spec = lambda max_frame: {'agent': {'algorithm': {'name': 'PPO', 'clip_eps_spec': piece}, 'net': {}},  # noqa: E731
                              'env': {'max_frame': max_frame}}
    (change,) = schedule_changes(spec(100000), spec(200000), {0: 100000})
    line = describe_schedule_change(change)
    assert '->' not in line
    assert line.startswith('agent.algorithm.clip_eps_spec: at frame 100000 the value is 1e-08: its end_step')
    assert 'stays at end_val 1e-08 for the whole extension' in line and 'end_step=200000' in line
    # a value that does change still says from what to what
    edited = {**piece, 'start_val': 0.3, 'end_step': 200000}
    moved = {'agent': {'algorithm': {'name': 'PPO', 'clip_eps_spec': edited}, 'net': {}}, 'env': {'max_frame': 200000}}
    (change,) = schedule_changes(spec(100000), moved, {0: 50000})
    assert 'the value goes 0.1 -> 0.225: the schedule was edited' in describe_schedule_change(change)


def test_recording_a_replay_prints_no_sdl_error_line():
    code = ('from slm_lab.experiment.enjoy import quiet_sdl; quiet_sdl(window=False); import gymnasium as gym; '
            "env = gym.make('CartPole-v1', render_mode='rgb_array'); env.reset(seed=0); "
            'print(env.render().shape); env.close()')
    env = {k: v for k, v in os.environ.items() if k not in ('XDG_RUNTIME_DIR', 'SDL_VIDEODRIVER', 'DISPLAY')}
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '(400, 600, 3)'
    assert 'XDG_RUNTIME_DIR' not in out.stderr and 'error' not in out.stderr.lower(), out.stderr


@pytest.mark.subprocess
def test_gpu_true_without_cuda_is_said_in_one_line(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip('this machine has a CUDA device')
    spec = copy.deepcopy(PPO)
    spec['agent']['net']['gpu'] = True
    spec['env']['max_frame'] = 64
    spec['meta'].update(log_frequency=64, eval_frequency=64)
    out = cli([write_spec(tmp_path, 'gpu_ppo', spec), 'gpu_ppo', 'train'], cwd=tmp_path, env=lab_env())
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if 'agent.net.gpu is true' in line]
    assert len(lines) == 1 and 'training on the CPU' in lines[0], out.stderr
