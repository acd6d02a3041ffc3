"""The lab trains without importing torch's compiler (agent/net/compiler_import.py, the steps of
agent/net/optim_steps.py), and gets the numbers opt.step() gets, for torch's optimizers and
SLM-Lab's. Each check needs a process that has not imported torch._dynamo yet, so it runs in a
fresh interpreter (a test process has usually imported it by then)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from lab_helpers import ROOT, lab_env

SCRIPT = textwrap.dedent('''
    import json, sys, tempfile, warnings
    import torch
    from slm_lab import lab
    from slm_lab.agent.net import compiler_import, net_util
    from slm_lab.agent.net.optim_steps import step_optimizer
    out = {}
    warnings.filterwarnings('error', message='.*lr_scheduler.step.*')  # stepped before the optimizer: fails it

    # a real run: fused Adam and a LinearToZero schedule, a snapshot, and its continuation
    data = tempfile.mkdtemp()
    lab.run('spec/demo.json', 'ppo_cartpole', 'train', ['env.max_frame=300', 'meta.max_session=1'], data_dir=data)
    lab.run('spec/demo.json', 'ppo_cartpole', 'train@latest', ['env.max_frame=600', 'meta.max_session=1'],
            data_dir=data)
    out['run_loaded_compiler'] = compiler_import.compiler_loaded()

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(5, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))

    def train(name, kwargs, use_lab_step, steps=4):
        model = net()
        opt = net_util.make_optimizer(model.parameters(), {'name': name, **kwargs})
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 - t / 10)
        torch.manual_seed(1)
        for _ in range(steps):
            for p in model.parameters():
                p.grad = None
            model(torch.randn(32, 5)).pow(2).mean().backward()
            step_optimizer(opt) if use_lab_step else opt.step()
            sched.step()
        return model, opt

    specs = [('Adam', {'lr': 1e-2, 'fused': True}),  # the lab's default: its own step after the first
             ('RMSprop', {'lr': 1e-3, 'alpha': 0.99, 'eps': 1e-5}),  # A2C's: the flat step after the first
             ('AdamW', {'lr': 1e-2, 'fused': True}),  # SLM-Lab v5's files; torch's step every time
             ('Adam', {'lr': 1e-2, 'fused': False}),  # a run saved before the fused default
             ('SGD', {'lr': 1e-2, 'momentum': 0.9}),
             ('RMSprop', {'lr': 1e-3, 'momentum': 0.5, 'centered': True}),
             ('GlobalAdam', {'lr': 1e-2})]
    ours = [train(name, kwargs, True) for name, kwargs in specs]
    lookahead = train('Lookahead', {'optimizer': 'RAdam', 'lr': 1e-2, 'k': 2}, True)
    out['steps_loaded_compiler'] = compiler_import.compiler_loaded()
    theirs = [train(name, kwargs, False) for name, kwargs in specs]  # opt.step(): loads the compiler
    out['reference_loaded_compiler'] = compiler_import.compiler_loaded()
    same = []
    for (m1, o1), (m2, o2) in zip(ours, theirs):
        same.append(all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters())))
        s1, s2 = o1.state_dict()['state'], o2.state_dict()['state']
        same.append(all(torch.equal(s1[k][key], s2[k][key]) for k in s2 for key in s2[k]))
    out['same'] = same

    # the compiler loaded: torch's own wrappers from the next call on
    fn = torch.optim.Optimizer.zero_grad.__wrapped__
    ours[0][1].zero_grad()
    out['torch_wrapper_after'] = getattr(fn, compiler_import.ATTR).__module__
    print(json.dumps(out))
''')


@pytest.mark.subprocess
def test_training_does_not_import_torchs_compiler_and_steps_as_opt_step():
    done = subprocess.run([sys.executable, '-c', SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**lab_env(), 'PYTHONPATH': str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out['run_loaded_compiler'] is False, 'a run, its snapshot and its continuation imported torch._dynamo'
    assert out['steps_loaded_compiler'] is False
    assert out['reference_loaded_compiler'] is True, 'torch changed: opt.step() no longer imports its compiler'
    assert out['same'] == [True] * 14  # weights and optimizer state of each optimizer, with a schedule
    assert out['torch_wrapper_after'].startswith('torch._dynamo'), out


HOOK = textwrap.dedent('''
    import builtins, os, sys
    _import = builtins.__import__
    def _watch(name, *args, **kwargs):
        if name.startswith('torch._dynamo') and 'torch._dynamo' not in sys.modules:
            open(os.path.join(os.environ['COMPILER_SEEN_DIR'], str(os.getpid())), 'w').close()
        return _import(name, *args, **kwargs)
    builtins.__import__ = _watch
''')


@pytest.mark.slow
@pytest.mark.subprocess
def test_session_processes_of_a_pool_do_not_import_torchs_compiler(tmp_path):
    """Three sessions, each in a process of its own, one more than the pool's width on this
    project's two cores, so one is started ahead of its turn and warmed up: none of the command's
    processes imports torch._dynamo (a sitecustomize records any that does; checked first on a
    process that does)."""
    hook_dir, seen = tmp_path / 'hook', tmp_path / 'seen'
    hook_dir.mkdir()
    seen.mkdir()
    (hook_dir / 'sitecustomize.py').write_text(HOOK)
    env = {**lab_env(), 'PYTHONPATH': str(hook_dir), 'COMPILER_SEEN_DIR': str(seen)}
    subprocess.run([sys.executable, '-c', 'import torch._dynamo'], env=env, check=True, timeout=120)
    assert len(list(seen.iterdir())) == 1, 'the hook records an import of the compiler'
    next(seen.iterdir()).unlink()
    done = subprocess.run([sys.executable, str(ROOT / 'run_lab.py'), str(ROOT / 'spec' / 'demo.json'), 'ppo_cartpole',
                           'train', '-s', 'env.max_frame=600', '-s', 'meta.max_session=3'],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'trial 0: 3 session(s)' in done.stderr
    assert not list(seen.iterdir()), 'a process of the run imported torch._dynamo'
