"""Generate the spec reference, docs/spec.md, from the schemas the validator itself uses.

    python -m tools.spec_doc           print the reference (markdown) to stdout
    python -m tools.spec_doc --write   write it to docs/spec.md

The prose is tools/spec_doc.md, a Markdown template; each `{{name}}` in it stands for a part made
here from the code: the key tables from the `Field`s of the spec's top level, meta and agent
(slm_lab.spec), of env (slm_lab.env.schema), of each registered algorithm, memory and net
(`spec_schema`) and of schedules (slm_lab.lib.decay), so the reference lists exactly the keys the
validator accepts, with their defaults and limits. test/spec/test_spec_doc.py fails when docs/spec.md
differs from what this module generates, so after changing a schema or the template, run `--write`.
Run from the repository root. Not part of the lab: nothing under slm_lab/ imports it.
"""
from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from pathlib import Path

from slm_lab.agent.algorithm import ALGORITHMS, PLANNED_ALGORITHMS, policy_util
from slm_lab.agent.algorithm.base import BASE_SCHEMA
from slm_lab.agent.algorithm.policy_util import PLANNED_PDTYPES
from slm_lab.agent.memory import MEMORIES, PLANNED_MEMORIES
from slm_lab.agent.net import NETS, PLANNED_NETS
from slm_lab.agent.net import PLANNED_KEYS as NET_KEYS
from slm_lab.agent.net.net_util import PLANNED_OPTIMIZERS
from slm_lab.lib.decay import SCHEDULE_SCHEMA
from slm_lab.lib.io import atomic_write_text
from slm_lab.lib.schema import MISSING, OMIT, TYPE_NAMES, Field  # noqa: F401  (MISSING: for the tests)
from slm_lab.persistence.edits import ALLOWED_EDITS
from slm_lab.spec import AGENT_SCHEMA, ENV_PLANNED_KEYS, ENV_SCHEMA, META_SCHEMA, RUNTIME_META, TOP_SCHEMA

TEMPLATE_PATH = Path(__file__).resolve().with_suffix('.md')
DOC_PATH = Path(__file__).resolve().parent.parent / 'docs' / 'spec.md'
PLACEHOLDER_RE = re.compile(r'\{\{(\w+)\}\}')
TEMPLATE_COMMENT = '<!-- template:'  # a paragraph of the template about the template, left out

# What the custom validators (Field.check) accept, by the validator's function name; a check
# without an entry here says it with its own @accepts note (slm_lab.lib.schema.accepts).
CHECK_NOTES = {
    '_check_env_name': 'an id registered in gymnasium (`ALE/...` ids load `ale_py` when it is installed)',
    '_check_optim_spec': 'a [torch.optim class and its arguments](#optimizers-optim_spec)',
    '_check_loss_spec': 'a [torch.nn loss and its arguments](#losses-loss_spec)',
    '_check_lr_scheduler_spec': '[`LinearToZero` or a torch LR scheduler](#lr-schedulers-lr_scheduler_spec)',
    '_check_schedule': '',  # described by the schema note below
}
MEMORY_NOTES = {
    'OnPolicyBatchReplay': 'The batch length is set by the algorithm, not here: `time_horizon` vector '
                           'steps for PPO, `num_step_returns` for n-step ActorCritic, `training_frequency` '
                           'vector steps for the others.',
    'OnPolicyReplay': 'The algorithm trains once `training_frequency` episodes have finished (n-step '
                      'ActorCritic: `num_step_returns` episodes, as in SLM-Lab).',
    'Replay': 'Each vector step adds `num_envs` transitions; once `max_size` is reached the oldest '
              'are overwritten.',
}


# ---------------------------------------------------------------------------------------------
# rendering one Field

def json_text(value) -> str:
    """A value as it is written in a JSON spec."""
    return json.dumps(value, ensure_ascii=False)


def type_text(fld: Field) -> str:
    """The JSON type(s) a Field accepts, e.g. 'int or null', 'list of int'."""
    names = []
    for t in fld.types:
        name = TYPE_NAMES.get(t, t.__name__)
        if t is list and fld.item_type is not None:
            name = f'list of {TYPE_NAMES.get(fld.item_type, fld.item_type.__name__)}'
        names.append(name)
    if fld.nullable:
        names.append('null')
    return ' or '.join(names)


def default_text(fld: Field) -> str:
    """The default as JSON, or 'required'."""
    if fld.default is MISSING:
        return '**required**'
    if fld.default is OMIT:
        return 'absent'
    return f'`{json_text(fld.default)}`'


def check_note(fld: Field, section: str, key: str) -> str | None:
    """What the custom check of the Field `key` of `section` accepts: its CHECK_NOTES entry, else its
    @accepts note ('' for a Field without a check); None when the check is described nowhere."""
    if fld.check is None:
        return ''
    return CHECK_NOTES.get(getattr(fld.check, '__name__', ''), getattr(fld.check, 'accepts', None))


def valid_text(fld: Field, section: str, key: str) -> str:
    """Choices, numeric range and nested-schema notes of a Field."""
    parts = []
    if fld.choices is not None:
        now = [c for c in fld.choices if c not in PLANNED_PDTYPES]
        later = [c for c in fld.choices if c in PLANNED_PDTYPES]
        parts.append(', '.join(f'`{json_text(c)}`' for c in now))
        if later:
            parts.append('not implemented yet: ' + ', '.join(f'`{json_text(c)}`' for c in later))
    if fld.planned:
        parts.append('not available yet: ' + ', '.join(f'`{json_text(v)}`' for v in fld.planned))
    if fld.aliases:
        parts.append('also accepted as ' + ', '.join(f'`{a}`' for a in fld.aliases))
    if fld.min is not None and fld.max is not None:
        parts.append(f'{fld.min:g} to {fld.max:g}' if not fld.min_exclusive else f'> {fld.min:g}, <= {fld.max:g}')
    elif fld.min is not None:
        parts.append(f'{">" if fld.min_exclusive else ">="} {fld.min:g}')
    elif fld.max is not None:
        parts.append(f'<= {fld.max:g}')
    if fld.schema is SCHEDULE_SCHEMA:
        parts.append('a [schedule](#schedules)')
    elif fld.schema is not None:
        parts.append('an object with keys ' + ', '.join(f'`{k}`' for k in fld.schema))
    note = check_note(fld, section, key)
    if note:
        parts.append(note)
    return '; '.join(parts)


def _cell(text: str) -> str:
    return text.replace('|', '\\|').replace('\n', ' ')


def table(schema: dict, section: str, keys=None) -> str:
    """A markdown table of the keys of a schema (all, or `keys`), in schema order."""
    rows = ['| Key | Type | Default | Valid values | Meaning |', '|---|---|---|---|---|']
    for key, fld in schema.items():
        if keys is not None and key not in keys:
            continue
        doc = fld.doc
        rows.append('| ' + ' | '.join(_cell(c) for c in (
            f'`{key}`', type_text(fld), default_text(fld), valid_text(fld, section, key), doc)) + ' |')
    return '\n'.join(rows)


def _first_paragraph(obj) -> str:
    doc = inspect.getdoc(obj) or ''
    return ' '.join(doc.split('\n\n')[0].split())


def _names(names) -> str:
    return ', '.join(f'`{n}`' for n in names)


# ---------------------------------------------------------------------------------------------
# generated sections

def algorithm_groups() -> list[list[type]]:
    """Registered algorithm classes grouped by module, in registry order."""
    groups: dict[str, list[type]] = {}
    for cls in ALGORITHMS.values():
        groups.setdefault(cls.__module__, []).append(cls)
    return list(groups.values())


def algorithm_own_keys(cls: type) -> list[str]:
    """Keys of an algorithm's schema that are not the common Field (new or changed)."""
    return [k for k, f in cls.spec_schema.items() if BASE_SCHEMA.get(k) is not f]


def _algorithm_section(group: list[type]) -> str:
    out = ['### ' + ', '.join(f'`{cls.__name__}`' for cls in group)]
    # with the modules of a family's members for other action types (SoftActorCritic's sac_discrete.py)
    modules = dict.fromkeys([group[0].__module__] + [m.__module__ for cls in group
                                                     for m in getattr(cls, 'members', {}).values()])
    for module in modules:
        module_doc = inspect.getdoc(sys.modules[module]) or ''
        if module_doc:
            out.append('```text\n' + module_doc + '\n```')
    documented: dict[int, str] = {}
    shown: dict[str, dict] = {}  # the schemas whose keys a table lists, by class name
    for cls in group:
        lines = [f'`{cls.__name__}`: {_first_paragraph(cls)}', '']
        needs = [f'`agent.{r}`' for r in cls.requires]
        lines.append(f'- Needs: {" and ".join(needs) if needs else "no memory and no net"}.')
        if 'memory' in cls.requires or cls.memory_names is not None:
            memories = cls.memory_names if cls.memory_names is not None else tuple(MEMORIES)
            lines.append(f'- Memories: {_names(memories)}.')
        spaces = 'Discrete or 1-D Box' if cls.continuous_ok else 'Discrete only'
        pdtypes = policy_util.PDTYPES if cls.continuous_ok else ('default',) + policy_util.DISCRETE_PDTYPES
        lines.append(f'- Action spaces: {spaces} (action_pdtype {_names(pdtypes)}).')
        out.append('\n'.join(lines))
        own = algorithm_own_keys(cls)
        # a schema that extends one shown above (DQN's: VanillaDQN's and double_q) lists what it adds
        extended = next((name for name, schema in shown.items()
                         if all(cls.spec_schema.get(k) is f for k, f in schema.items())), None)
        if id(cls.spec_schema) in documented:
            out.append(f'Keys: the same as `{documented[id(cls.spec_schema)]}`.')
        elif extended is not None:
            added = [k for k in cls.spec_schema if k not in shown[extended]]
            out.append(f'Keys: those of `{extended}`, and:\n\n' + table(cls.spec_schema, cls.__name__, added))
            documented[id(cls.spec_schema)] = cls.__name__
            shown[cls.__name__] = cls.spec_schema
        elif own:
            out.append(f'Keys of `{cls.__name__}`, besides the common ones:\n\n'
                       + table(cls.spec_schema, cls.__name__, own))
            documented[id(cls.spec_schema)] = cls.__name__
            shown[cls.__name__] = cls.spec_schema
        else:
            out.append('Keys: only the common ones.')
            documented[id(cls.spec_schema)] = cls.__name__
    return '\n\n'.join(out)


def _memory_sections() -> str:
    out = []
    for name, cls in MEMORIES.items():
        users = [a for a, c in ALGORITHMS.items() if c.memory_names is not None and name in c.memory_names]
        text = [f'### `{name}`', '', _first_paragraph(cls)]
        if name in MEMORY_NOTES:
            text += ['', MEMORY_NOTES[name]]
        text += ['', f'Used by: {_names(users) if users else "no algorithm yet"}.', '', table(cls.spec_schema, name)]
        out.append('\n'.join(text))
    return '\n\n'.join(out)


def _net_use() -> str:
    """What nets each algorithm builds from agent.net: the `nets_doc` of each algorithm class,
    one bullet per group of algorithms that share it."""
    groups: dict[str, list[str]] = {}
    for name, cls in ALGORITHMS.items():
        if cls.nets_doc:
            groups.setdefault(cls.nets_doc, []).append(name)
    return '\n'.join(f'- {", ".join(f"`{n}`" for n in names)}: {" ".join(doc.split())}'
                     for doc, names in groups.items())


def _net_sections() -> str:
    out = []
    for name, cls in NETS.items():
        out.append('\n'.join([f'### `{name}`', '', _first_paragraph(cls), '', table(cls.spec_schema, name)]))
    return '\n\n'.join(out)


def _planned() -> str:
    rows = [
        ('`agent.algorithm.name`', PLANNED_ALGORITHMS),
        ('`agent.memory.name`', PLANNED_MEMORIES),
        ('`agent.net.type`', PLANNED_NETS),
        ('`agent.algorithm.action_pdtype`', policy_util.PLANNED_PDTYPES),
    ]
    lines = ['| Key | Not available yet |', '|---|---|']
    lines += [f'| {key} | {_names(names)} |' for key, names in rows]
    return '\n'.join(lines)


def all_schemas() -> list[tuple[str, str, dict]]:
    """(key path prefix, owner, schema) of every schema the validator uses, nested ones included."""
    out = [('', 'spec', TOP_SCHEMA), ('env', 'env', ENV_SCHEMA), ('meta', 'meta', META_SCHEMA)]
    for (kind, name), schema in component_schemas():
        prefix = 'agent.net' if kind == 'net' else f'agent.{kind}'
        out.append((prefix, name, schema))
    nested = []
    for prefix, owner, schema in out:
        for key, fld in schema.items():
            if fld.schema is not None and fld.schema is not SCHEDULE_SCHEMA:
                nested.append((f'{prefix}.{key}' if prefix else key, owner, fld.schema))
    return out + nested


def _slm_lab_fields() -> list[tuple[str, str, str, Field]]:
    """(key path, owners, key, Field) of every key that exists for SLM-Lab specs: its doc names
    SLM-Lab, or it is ignored, or it has an alias or values that are not available yet."""
    rows: dict[tuple, list[str]] = {}
    fields = {}
    for prefix, owner, schema in all_schemas():
        for key, fld in schema.items():
            if 'SLM-Lab' in fld.doc or fld.default is OMIT or fld.aliases or fld.planned:
                path = f'{prefix}.{key}' if prefix else key
                rows.setdefault((path, fld.doc), []).append(owner)
                fields[(path, fld.doc)] = (key, fld)
    return [(path, ', '.join(owners), *fields[(path, doc)]) for (path, doc), owners in rows.items()]


def _false_only_keys() -> str:
    """Keys kept for SLM-Lab specs that accept only false."""
    found = [f'`meta.{k}`' for k, f in META_SCHEMA.items() if f.choices == (False,)]
    for name, schema in component_schemas():
        prefix = {'algorithm': 'agent.algorithm', 'memory': 'agent.memory', 'net': 'agent.net'}[name[0]]
        for k, f in schema.items():
            if f.choices == (False,) and f'`{prefix}.{k}`' not in found:
                found.append(f'`{prefix}.{k}`')
    if not found:
        return ''
    return '- These keys exist for SLM-Lab specs and accept only `false`: ' + ', '.join(found) + '.\n'



def component_schemas() -> list[tuple[tuple[str, str], dict]]:
    """((kind, class name), spec_schema) of every registered algorithm, memory and net."""
    out = [(('algorithm', n), c.spec_schema) for n, c in ALGORITHMS.items()]
    out += [(('memory', n), c.spec_schema) for n, c in MEMORIES.items()]
    out += [(('net', n), c.spec_schema) for n, c in NETS.items()]
    return out


def slm_lab_tables() -> dict[str, str]:
    """The tables of the SLM-Lab keys section: keys SLM-Lab renamed (both names accepted), keys
    accepted for SLM-Lab specs, and keys and values that wait for a later component."""
    fields = _slm_lab_fields()
    aliases = ['| Key | Also accepted as | In |', '|---|---|---|']
    aliases += [f'| `{path}` | {_names(fld.aliases)} | {owners} |' for path, owners, _, fld in fields if fld.aliases]
    accepted = ['| Key | In | Meaning here |', '|---|---|---|']
    accepted += [f'| `{path}` | {owners} | {_cell(fld.doc)} |' for path, owners, _, fld in fields
                 if not fld.aliases and not fld.planned]
    planned = ['| Key or value | What it needs |', '|---|---|']
    for prefix, keys in (('agent.net', NET_KEYS), ('env', ENV_PLANNED_KEYS)):
        planned += [f'| `{prefix}.{key}` | {_cell(what)} |' for key, what in keys.items()]
    for path, _, _, fld in fields:
        planned += [f'| `{path}`: `{json_text(value)}` | {_cell(what)} |' for value, what in fld.planned.items()] \
            if fld.planned else []
    planned += [f'| `*optim_spec.name`: `"{name}"` | {_cell(what)} |' for name, what in PLANNED_OPTIMIZERS.items()]
    return {'renamed_keys_table': '\n'.join(aliases), 'accepted_keys_table': '\n'.join(accepted),
            'planned_keys_table': '\n'.join(planned)}


# ---------------------------------------------------------------------------------------------
# the document

def parts() -> dict[str, str]:
    """Each `{{name}}` of the template and the text made from the code that replaces it."""
    user_meta = [k for k in META_SCHEMA if k not in RUNTIME_META]
    runtime_meta = [k for k in META_SCHEMA if k in RUNTIME_META]
    return {
        'top_table': table(TOP_SCHEMA, 'spec'),
        'agent_table': table(AGENT_SCHEMA, 'agent'),
        'algorithm_table': table(BASE_SCHEMA, 'algorithm'),
        'algorithm_sections': '\n\n'.join(s for s in map(_algorithm_section, algorithm_groups()) if s),
        'memory_sections': _memory_sections(),
        'net_use': _net_use(),
        'net_sections': _net_sections(),
        'schedule_table': table(SCHEDULE_SCHEMA, 'schedule'),
        'env_table': table(ENV_SCHEMA, 'env'),
        'meta_table': table(META_SCHEMA, 'meta', user_meta),
        'meta_runtime_table': table(META_SCHEMA, 'meta', runtime_meta),
        'allowed_edits': _names(ALLOWED_EDITS),
        'false_only_keys': _false_only_keys(),
        'planned_names_table': _planned(),
        **slm_lab_tables(),
    }


def render(template: str, values: dict[str, str]) -> str:
    """The template with each `{{name}}` replaced by values[name]. A paragraph that is one
    placeholder whose value is empty is left out, as are the template's own comments."""
    out = []
    for paragraph in template.rstrip('\n').split('\n\n'):
        if paragraph.startswith(TEMPLATE_COMMENT):
            continue
        whole = PLACEHOLDER_RE.fullmatch(paragraph)
        text = values[whole[1]] if whole else PLACEHOLDER_RE.sub(lambda m: values[m[1]], paragraph)
        if text:
            out.append(text)
    return '\n\n'.join(out) + '\n'


def generate() -> str:
    """The whole reference as markdown (deterministic: it depends only on the code and the template)."""
    return render(TEMPLATE_PATH.read_text(encoding='utf-8'), parts())


def main(argv: list[str] | None = None) -> int:
    """Print the reference, or write it to docs/spec.md with --write."""
    parser = argparse.ArgumentParser(prog='python -m tools.spec_doc', description=__doc__.split('\n')[0])
    parser.add_argument('--write', action='store_true', help=f'write {DOC_PATH.relative_to(DOC_PATH.parent.parent)} '
                                                             'instead of printing')
    args = parser.parse_args(argv)
    text = generate()
    if args.write:
        atomic_write_text(DOC_PATH, text)
        print(f'wrote {DOC_PATH}')
    else:
        sys.stdout.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
