"""Reading spec files: JSON (with the trailing commas SLM-Lab's files have) or YAML, holding only
the values a JSON spec holds and nested no deeper than a spec is; one spec picked out of a file by
its name, which must be a plain file name."""
from __future__ import annotations

import copy
import json
import os
import re
from typing import Any

import yaml

from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import suggest

TRAILING_COMMA_RE = re.compile(r',\s*[}\]]')  # a quick test before the character scan
# A spec name becomes the run directory's name and the prefix of every file in it, so it must be
# a plain file name: no path separators, no leading dot (hidden, or '..'), short enough that the
# longest file name made from it stays under the usual 255-byte limit.
SPEC_NAME_RE = re.compile(r'[A-Za-z0-9_\-][A-Za-z0-9_.\-]*')
SPEC_NAME_MAX_LEN = 128
YAML_EXTS = ('.yaml', '.yml')
# A YAML file's aliases share one object however often they are used, but the spec built from it
# is expanded (merged, copied, written as JSON): a few nested aliases ("billion laughs") would
# expand to more values than any spec holds. SLM-Lab's largest YAML file has a few thousand.
MAX_SPEC_VALUES = 1_000_000
# Objects and lists inside each other: SLM-Lab's deepest spec (a torcharc arc) nests 7; the lab's
# recursive walks over a spec (placeholders, validation, diffs) stay far from Python's limit.
MAX_SPEC_DEPTH = 64


def spec_depth_error(value: Any) -> str | None:
    """Where `value` nests objects and lists more than MAX_SPEC_DEPTH deep (a key path), else None.
    Walked without recursion, so any depth is measured."""
    stack = [(value, '', 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= MAX_SPEC_DEPTH:
                return path or 'the top level'
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((item, f'{path}.{key}' if path else str(key), depth + 1) for key, item in items)
    return None


def strip_trailing_commas(text: str) -> str:
    """`text` with every comma that closes a JSON list or object (`[1, 2,]`, `{"a": 1,}`) replaced
    by a space, as SLM-Lab's reader accepts them (its v4 spec files all have them). Commas in
    strings are kept, and so is any comma that does not follow a value (`[,]`, `[1,,]`), so the
    JSON reader still reports those; the text keeps its length and line breaks, so an error's
    line and column are those of the file."""
    if not TRAILING_COMMA_RE.search(text):
        return text
    out = list(text)
    in_string = escaped = False
    last = ''  # the last character outside strings and whitespace
    comma = None  # index of a comma after a value, trailing if a bracket closes next
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == '\\':
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch in ' \t\r\n':
            continue
        if ch in '}]' and comma is not None:
            out[comma] = ' '
        comma = i if ch == ',' and last and last not in '[{,:' else None
        in_string = ch == '"'
        last = ch
    return ''.join(out)


def _yaml_loader():
    """PyYAML's safe loader, reading `1e7` and `5e-4` as numbers (YAML 1.2 does; PyYAML's YAML 1.1
    rules want `1.0e+7`), so a frame count is written the same way in YAML and JSON specs."""
    class SpecLoader(yaml.SafeLoader):
        """Safe loader with YAML 1.2 exponent floats."""

    SpecLoader.add_implicit_resolver(
        'tag:yaml.org,2002:float',
        re.compile(r'^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$'), list('-+0123456789'))
    return SpecLoader


def _parse_yaml(text: str, spec_file: str) -> Any:
    try:
        return yaml.load(text, Loader=_yaml_loader())  # a safe loader: no Python objects
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f' at line {mark.line + 1} column {mark.column + 1}' if mark else ''
        what = ' '.join(str(e.problem or e.context or type(e).__name__).split())
        raise SpecError(f'spec file {spec_file}: invalid YAML{where}: {what}') from None
    except yaml.YAMLError as e:
        raise SpecError(f'spec file {spec_file}: invalid YAML: {" ".join(str(e).split())}') from None


def _check_plain(value: Any, spec_file: str) -> None:
    """SpecError unless `value` is made only of what JSON holds (objects with string keys, lists,
    strings, numbers, booleans, null): YAML also reads dates, sets, binary and other keys, which no
    spec value means and which the saved JSON specs could not record; and at most MAX_SPEC_VALUES
    values, counted as expanded, with no object that contains itself (a recursive alias)."""
    count = 0
    stack = [(value, '', ())]
    while stack:
        node, path, inside = stack.pop()
        count += 1
        if count > MAX_SPEC_VALUES:
            raise SpecError(f'spec file {spec_file}: more than {MAX_SPEC_VALUES} values once its aliases are '
                            'expanded; a spec file holds specs, not data')
        if isinstance(node, (dict, list)):
            if id(node) in inside:
                raise SpecError(f'spec file {spec_file}: {path or "the file"} contains itself (a recursive '
                                'alias); a spec must be a tree')
            inside = inside + (id(node),)
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise SpecError(f'spec file {spec_file}: {path + "." if path else ""}{key!r}: keys must be '
                                    f'strings, got {type(key).__name__}; quote it')
                stack.append((item, f'{path}.{key}' if path else key, inside))
        elif isinstance(node, list):
            stack.extend((item, f'{path}[{i}]', inside) for i, item in enumerate(node))
        elif node is not None and not isinstance(node, (str, bool, int, float)):
            raise SpecError(f'spec file {spec_file}: {path}: {node!r} is a YAML {type(node).__name__}, not a spec '
                            'value (string, number, boolean, null, list or object); quote it if it is a string')


def read_spec_file(spec_file: str) -> dict:
    """Parse a spec file: JSON (trailing commas accepted, as SLM-Lab does), or YAML for a name
    ending in .yaml / .yml (safe loading: anchors, aliases and `<<:` merges, no Python objects).
    Returns its top-level object. SpecError for a missing file, a syntax error (with line and
    column), a value JSON cannot hold, or a top level that is not an object."""
    if not os.path.isfile(spec_file):
        where = 'is a directory' if os.path.isdir(spec_file) else 'not found'
        if where == 'not found' and not os.path.isabs(spec_file):
            where += f' in {os.getcwd()}'  # a relative path: say where it was looked for
            if not os.path.isdir('spec') and not os.path.isfile('run_lab.py'):
                where += " (the lab's own spec/ files are in its repository: run from its root)"
        raise SpecError(f'spec file {spec_file} {where}; give the path of a JSON or YAML spec file, '
                        'e.g. spec/demo.json')
    try:
        with open(spec_file, encoding='utf-8') as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise SpecError(f'spec file {spec_file}: not UTF-8 text (byte {e.start}); save it as UTF-8') from None
    is_yaml = spec_file.lower().endswith(YAML_EXTS)
    kind = 'YAML' if is_yaml else 'JSON'
    try:
        if is_yaml:
            specs = _parse_yaml(text, spec_file)
            _check_plain(specs, spec_file)
        else:
            specs = json.loads(strip_trailing_commas(text))
    except json.JSONDecodeError as e:
        raise SpecError(f'spec file {spec_file}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}') from None
    except RecursionError:
        raise SpecError(f'spec file {spec_file}: nested too deeply to be a spec') from None
    except ValueError as e:  # a number of more digits than Python converts (4300)
        raise SpecError(f'spec file {spec_file}: {e.args[0].split(";")[0]}; no spec value is that long') from None
    if not isinstance(specs, dict):
        raise SpecError(f'spec file {spec_file}: expected a {kind} object mapping spec names to specs')
    deep = spec_depth_error(specs)
    if deep is not None:
        parts = deep.split('.')
        where = '.'.join(parts[:4]) + ('...' if len(parts) > 4 else '')
        raise SpecError(f'spec file {spec_file}: {where} nests objects or lists more than {MAX_SPEC_DEPTH} '
                        'deep, which no spec does; flatten it')
    return specs


def is_template_name(spec_file: str, name: str) -> bool:
    """In a YAML spec file, a top-level key starting with '_' holds shared pieces that specs
    merge with `<<: *anchor` (SLM-Lab's convention), not a spec."""
    return spec_file.lower().endswith(YAML_EXTS) and name.startswith('_')


def is_single_spec(data: dict) -> bool:
    """Whether a spec file's top level is one spec rather than {name: spec}: the specs the lab
    saves in a run directory (`{name}_spec.json`, `{name}_t0_s0_spec.json`) are. Told apart by an
    `agent` that is an agent (it has an `algorithm`), as a spec named 'agent' is not."""
    agent = data.get('agent')
    if isinstance(agent, list) and len(agent) == 1:
        agent = agent[0]
    return isinstance(agent, dict) and 'algorithm' in agent and 'env' in data


def check_spec_name(spec_name: Any) -> str:
    """The spec name, or a SpecError: it names the run directory and its files, so it must be a
    plain name (letters, digits, '_', '-', '.', not starting with '.'), never a path."""
    if not isinstance(spec_name, str) or not SPEC_NAME_RE.fullmatch(spec_name) \
            or len(spec_name) > SPEC_NAME_MAX_LEN:
        raise SpecError(f'spec name {spec_name!r} is not a valid name: use letters, digits, _, - and . '
                        f'(not first), at most {SPEC_NAME_MAX_LEN} characters; it names the run directory '
                        'under data/, so it cannot be a path')
    return spec_name


def get_raw_spec(spec_file: str, spec_name: str) -> dict:
    """The named spec from a spec file, unvalidated. A file that is one spec (a spec the lab
    saved in a run directory) gives that spec under its recorded name."""
    check_spec_name(spec_name)
    data = read_spec_file(spec_file)
    if is_single_spec(data):
        recorded = data.get('name')
        if recorded is not None and recorded != spec_name:
            raise SpecError(f"{spec_file} holds one spec, named {recorded!r}, not {spec_name!r}; "
                            f'run it as: {spec_file} {recorded} MODE')
        spec = data
    else:
        specs = [name for name in data if not is_template_name(spec_file, name)]
        names = ', '.join(specs) or '(none)'
        if spec_name not in data:
            raise SpecError(f"spec name '{spec_name}' is not in {spec_file}{suggest(spec_name, specs)}; "
                            f'specs in that file: {names}')
        if is_template_name(spec_file, spec_name):
            raise SpecError(f"'{spec_name}' in {spec_file} is a template (a YAML key starting with _ holds pieces "
                            f'that specs merge in), not a spec; specs in that file: {names}')
        spec = data[spec_name]
    if not isinstance(spec, dict):
        raise SpecError(f'{spec_file}: spec {spec_name} must be an object')
    return copy.deepcopy(spec)
