"""docs/spec.md is generated from the schemas and a Markdown template (tools/spec_doc.py,
tools/spec_doc.md): it must be up to date, name every key the validator accepts, and what it says
by hand about the code must hold."""
from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slm_lab import spec as spec_package
from slm_lab.lib.errors import SpecError
from slm_lab.spec import ENV_SCHEMA, META_SCHEMA, validate_spec
from tools import spec_doc

REPO_ROOT = Path(__file__).resolve().parents[2]
REGENERATE = 'run: python -m tools.spec_doc --write'
MINIMAL = {'agent': {'algorithm': {'name': 'Random'}}, 'env': {'name': 'CartPole-v1', 'max_frame': 10}}


def doc_text() -> str:
    assert spec_doc.DOC_PATH.is_file(), f'{spec_doc.DOC_PATH} is missing; {REGENERATE}'
    return spec_doc.DOC_PATH.read_text(encoding='utf-8')


def sections(text: str) -> dict[str, str]:
    """Markdown heading line -> the text up to the next heading (headings in code blocks skipped)."""
    out, heading, body, fenced = {}, '', [], False
    for line in text.splitlines():
        if line.startswith('```'):
            fenced = not fenced
        if not fenced and re.match(r'#{1,6} ', line):
            out[heading] = '\n'.join(body)
            heading, body = line, []
        else:
            body.append(line)
    out[heading] = '\n'.join(body)
    return out


def section(text: str, heading_part: str, level: str = '##') -> str:
    """The body of the one heading of `level` that contains `heading_part`."""
    found = [body for h, body in sections(text).items() if h.startswith(level + ' ') and heading_part in h]
    assert len(found) == 1, f'expected one "{level}" heading containing {heading_part!r} in docs/spec.md'
    return found[0]


def schemas_by_section() -> list[tuple[str, str, dict, list[str]]]:
    """(heading level, heading part, schema, keys that must have a row there) for every schema."""
    from slm_lab.agent.algorithm import ALGORITHMS
    from slm_lab.agent.algorithm.base import BASE_SCHEMA
    from slm_lab.agent.memory import MEMORIES
    from slm_lab.agent.net import NETS
    from slm_lab.lib.decay import SCHEDULE_SCHEMA
    out = [
        ('##', 'Spec files and the top level', spec_doc.TOP_SCHEMA, list(spec_doc.TOP_SCHEMA)),
        ('##', '`agent`', spec_doc.AGENT_SCHEMA, list(spec_doc.AGENT_SCHEMA)),
        ('##', '`agent.algorithm`', BASE_SCHEMA, list(BASE_SCHEMA)),
        ('##', 'Schedules', SCHEDULE_SCHEMA, list(SCHEDULE_SCHEMA)),
        ('##', '`env`', ENV_SCHEMA, list(ENV_SCHEMA)),
        ('##', '`meta`', META_SCHEMA, list(META_SCHEMA)),
    ]
    for name, cls in ALGORITHMS.items():
        own = [k for k, f in cls.spec_schema.items() if BASE_SCHEMA.get(k) is not f]
        out.append(('###', f'`{name}`', cls.spec_schema, own))
    for registry in (MEMORIES, NETS):
        for name, cls in registry.items():
            out.append(('###', f'`{name}`', cls.spec_schema, list(cls.spec_schema)))
    return out


def test_spec_md_is_up_to_date():
    expected, actual = spec_doc.generate(), doc_text()
    if actual != expected:
        diff = ''.join(list(difflib.unified_diff(actual.splitlines(True), expected.splitlines(True),
                                                 'docs/spec.md', 'generated'))[:60])
        pytest.fail(f'docs/spec.md differs from the schemas; {REGENERATE}\n{diff}')


@pytest.mark.parametrize('level,heading,schema,keys', schemas_by_section(),
                         ids=[f'{h}' for _, h, _, _ in schemas_by_section()])
def test_every_schema_key_has_a_row_in_its_section(level, heading, schema, keys):
    body = section(doc_text(), heading, level)
    missing = [k for k in keys if f'| `{k}` |' not in body]
    assert not missing, f'docs/spec.md section {heading} has no row for {missing}; {REGENERATE}'


def test_documented_top_and_agent_keys_are_the_validators():
    # one copy of each schema: the generator documents the validator's own dicts
    assert spec_doc.TOP_SCHEMA is spec_package.TOP_SCHEMA and spec_doc.AGENT_SCHEMA is spec_package.AGENT_SCHEMA
    spec = validate_spec(MINIMAL)
    # keys with the OMIT default (SLM-Lab's spec_params) stay out of a spec that does not give them
    assert list(spec) == [k for k, f in spec_doc.TOP_SCHEMA.items() if f.default is not spec_doc.OMIT]
    assert list(spec['agent']) == [k for k, f in spec_doc.AGENT_SCHEMA.items() if f.default is not spec_doc.OMIT]
    assert spec['search'] is None and spec['agent']['memory'] is None and spec['agent']['net'] is None
    assert spec['agent']['name'] == 'Random', 'agent.name defaults to the algorithm name'
    with pytest.raises(SpecError, match='valid keys: ' + ', '.join(spec_doc.TOP_SCHEMA) + '$'):
        validate_spec({**MINIMAL, 'bogus': 1})
    with pytest.raises(SpecError, match='valid keys: ' + ', '.join(spec_doc.AGENT_SCHEMA) + '$'):
        validate_spec({**MINIMAL, 'agent': {**MINIMAL['agent'], 'bogus': 1}})
    # keys a user does not write (set by the lab or by SLM-Lab in saved specs, or read by nothing)
    # are accepted but not offered
    with pytest.raises(SpecError) as e:
        validate_spec({**MINIMAL, 'meta': {'log_frequncy': 500}})
    offered = str(e.value).split('valid keys: ')[1].split(', ')
    assert 'log_frequency' in offered and not {'prepath', 'git_sha', 'experiment_ts', 'train_mode'} & set(offered)
    for key, fld in spec_doc.TOP_SCHEMA.items():
        if fld.default is spec_doc.MISSING:
            with pytest.raises(SpecError, match=f'spec.{key}: required key is missing'):
                validate_spec({k: v for k, v in MINIMAL.items() if k != key})


def test_every_custom_check_is_described():
    """A Field with its own validator must say in the reference what it accepts."""
    for _, heading, schema, _ in schemas_by_section():
        section_name = heading.strip('`')
        for key, fld in schema.items():
            if fld.check is not None:
                note = spec_doc.check_note(fld, section_name, key)
                assert note is not None, (f'{heading}.{key}: describe its check '
                                          f'{getattr(fld.check, "__name__", fld.check)!r} in spec_doc.CHECK_NOTES '
                                          'or with @accepts on the check')


def test_the_spec_examples_in_the_doc_are_valid():
    text = doc_text()
    blocks = re.findall(r'```json\n(.*?)```', text, re.S)
    assert len(blocks) == 2
    specs = json.loads(blocks[0])
    for name, spec in specs.items():
        validate_spec(spec, name)
    schedule = json.loads('{' + blocks[1] + '}')
    dqn = {'agent': {'algorithm': {'name': 'DQN', **schedule}, 'memory': {'name': 'Replay'},
                     'net': {'type': 'MLPNet'}},
           'env': {'name': 'CartPole-v1', 'max_frame': 10}}
    validate_spec(dqn)


def test_gpu_accepts_what_the_doc_says():
    net = {'type': 'MLPNet'}
    for value in (True, False, 'auto'):
        validate_spec({**MINIMAL, 'agent': {**MINIMAL['agent'], 'net': {**net, 'gpu': value}}})
    with pytest.raises(SpecError, match='agent.net.gpu'):
        validate_spec({**MINIMAL, 'agent': {**MINIMAL['agent'], 'net': {**net, 'gpu': 'cuda'}}})


def test_write_replaces_the_file(tmp_path, monkeypatch, capsys):
    target = tmp_path / 'docs' / 'spec.md'
    monkeypatch.setattr(spec_doc, 'DOC_PATH', target)
    assert spec_doc.main(['--write']) == 0
    assert target.read_text(encoding='utf-8') == spec_doc.generate()
    assert spec_doc.main([]) == 0
    assert capsys.readouterr().out.endswith(spec_doc.generate())


@pytest.mark.slow
@pytest.mark.subprocess
def test_module_prints_the_same_text_in_a_fresh_process():
    """`python -m tools.spec_doc` prints docs/spec.md exactly, whatever the hash seed."""
    env = {**os.environ, 'PYTHONHASHSEED': '12345'}
    out = subprocess.run([sys.executable, '-m', 'tools.spec_doc'], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == doc_text(), REGENERATE


def test_every_placeholder_of_the_template_is_filled_and_every_part_used():
    template = spec_doc.TEMPLATE_PATH.read_text(encoding='utf-8')
    body = '\n\n'.join(p for p in template.split('\n\n') if not p.startswith(spec_doc.TEMPLATE_COMMENT))
    assert sorted(set(spec_doc.PLACEHOLDER_RE.findall(body))) == sorted(spec_doc.parts())
    assert not spec_doc.PLACEHOLDER_RE.search(spec_doc.generate())
