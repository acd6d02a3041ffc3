"""slm_lab/lib/malloc.py: a session's process keeps the memory of its large tensors for the next step."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

# a fresh process (glibc's settings are per process): 64 MiB tensors, above glibc's own largest
# mmap threshold (32 MiB), allocated, written and freed: ten times for the heap to settle (its
# first rounds grow it), then the page faults of ten more
PROBE = '''
import json, resource, sys, torch
from slm_lab.lib import malloc
on = malloc.keep_freed_memory() if sys.argv[1] == 'lab' else False
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.empty(64 << 20, dtype=torch.uint8).fill_(1)
start = faults()
for _ in range(10):
    torch.empty(64 << 20, dtype=torch.uint8).fill_(1)
print(json.dumps({'on': on, 'again': malloc.keep_freed_memory(), 'faults': faults() - start,
                  'mmap_threshold': malloc._state.get('mmap_threshold')}))
'''

glibc = pytest.mark.skipif(not sys.platform.startswith('linux') or platform.libc_ver()[0] != 'glibc',
                           reason="glibc's malloc only")


def probe(mode: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if not (k.startswith('MALLOC_') or k in ('GLIBC_TUNABLES', 'SLM_LAB_MALLOC'))}
    out = subprocess.run([sys.executable, '-c', PROBE, mode], capture_output=True, text=True, timeout=120,
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr
    return {**json.loads(out.stdout.splitlines()[-1]), 'stderr': out.stderr}


@pytest.fixture(scope='module')
def default_faults() -> int:
    """glibc as it is: each 64 MiB tensor freshly mapped (16,384 pages of 4 KiB; fewer with
    transparent huge pages), at least one fault per tensor."""
    faults = probe('none')['faults']
    assert faults >= 10
    return faults


@glibc
def test_large_tensors_freed_are_reused_without_page_faults(default_faults):
    kept = probe('lab')
    assert kept['on'] and kept['again']
    if kept['mmap_threshold'] < 64 << 20:
        pytest.skip("this glibc caps the mmap threshold at 32 MiB: the probe's 64 MiB tensors stay mapped")
    assert kept['faults'] * 10 < default_faults, (kept, default_faults)  # the heap's pages are reused


@glibc
@pytest.mark.parametrize('env', [{'SLM_LAB_MALLOC': 'system'}, {'MALLOC_TOP_PAD_': '0'},
                                 {'GLIBC_TUNABLES': 'glibc.malloc.trim_threshold=1000'}])
def test_the_users_own_thresholds_or_opt_out_are_left_alone(env, default_faults):
    result = probe('lab', **env)
    assert not result['on'] and not result['again'] and result['mmap_threshold'] is None
    assert result['faults'] * 2 > default_faults, (result, default_faults)


@glibc
def test_other_malloc_settings_keep_the_labs_and_a_wrong_opt_out_is_said():
    result = probe('lab', MALLOC_ARENA_MAX='2', SLM_LAB_MALLOC='off')
    assert result['on']
    assert "SLM_LAB_MALLOC=off: only 'system' is read" in result['stderr']


def test_a_session_sets_it(tmp_path, monkeypatch):
    from lab_helpers import PPO

    from slm_lab import lab
    from slm_lab.lib import malloc
    monkeypatch.setattr(malloc, '_state', {})  # as a fresh process: not asked yet
    spec = json.loads(json.dumps(PPO))
    spec['env']['max_frame'] = 64
    path = tmp_path / 'spec.json'
    path.write_text(json.dumps({'tiny': spec}))
    lab.run(str(path), 'tiny', 'train', data_dir=str(tmp_path / 'data'))
    assert 'on' in malloc._state  # Session.__init__ asked for it (on or off by the environment)
