"""The CPU tier's rows train the lab's copies of SLM-Lab v5's benchmark specs
(spec/benchmark/suites/slm_lab_v5_cpu.json): each copy must set every agent and env key as SLM-Lab's
file did at the reference commit, so that a row measures SLM-Lab's spec. The fixture holds those
keys, read from SLM-Lab's files (JSON and YAML) at commit 96be393; a copy once lacked SAC's
`init_fn` and its rows trained from another initialisation unnoticed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((ROOT / 'test' / 'fixtures' / 'slm_lab_v5_cpu_reference_keys.json').read_text())
SUITE = json.loads((ROOT / 'spec' / 'benchmark' / 'suites' / 'slm_lab_v5_cpu.json').read_text())


def flat(node, prefix: str = '') -> dict:
    """Dotted key -> value for every leaf (an empty dict is a leaf)."""
    if isinstance(node, dict) and node:
        out = {}
        for key, value in node.items():
            out.update(flat(value, f'{prefix}.{key}' if prefix else key))
        return out
    return {prefix: node}


def training_keys(spec: dict) -> dict:
    return {k: v for k, v in flat(spec).items() if k.split('.')[0] in ('agent', 'env')}


def allowed(key: str, ours, theirs, copy: dict) -> bool:
    """The differences that change nothing a run computes."""
    if key == 'agent.net.normalize' and ours == '<absent>' and copy['agent']['net'].get('type') == 'MLPNet':
        return True  # SLM-Lab's MLPNet ignores it (the lab's schema says so too)
    if key.endswith('_spec.end_step'):  # a no_decay schedule's steps are not read
        schedule = copy['agent']['algorithm'].get(key.split('.')[2], {})
        return schedule.get('name') == 'no_decay'
    if key == 'agent.algorithm.clip_val_loss' and theirs == '<absent>' and ours is False:
        return True  # the default written out
    return False


@pytest.mark.parametrize('row', SUITE['rows'], ids=lambda r: r['id'])
def test_each_rows_copy_sets_slm_labs_keys(row):
    reference = REFERENCE['rows'][row['id']]
    assert reference['spec_name'] == row['spec_name']
    copy = json.loads((ROOT / row['spec_file']).read_text())[row['spec_name']]
    ours, theirs = training_keys(copy), reference['keys']
    differ = [(k, ours.get(k, '<absent>'), theirs.get(k, '<absent>')) for k in sorted(set(ours) | set(theirs))
              if ours.get(k, '<absent>') != theirs.get(k, '<absent>')]
    unexplained = [d for d in differ if not allowed(*d, copy)]
    assert not unexplained, f'{row["spec_file"]} {row["spec_name"]} differs from SLM-Lab\'s ' \
                            f'{reference["source"]}: {unexplained}'
