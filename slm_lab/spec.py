"""Read a spec file, apply command-line overrides, fill defaults, validate, and diff two specs.

A spec file is JSON mapping spec names to specs (SLM-Lab's form):
`{"ppo_cartpole": {"agent": {...}, "env": {...}, "meta": {...}, "search": {...}}}`.
Validation happens before anything runs and names the offending key path.
"""
from __future__ import annotations

import copy
import json
import os
import re
from typing import Any

from slm_lab.lib.errors import SpecError
from slm_lab.lib.schema import OMIT, Field, accepts, check_finite, check_object, ignored_field, not_available, suggest

PLACEHOLDER_RE = re.compile(r'\$\{([A-Za-z0-9_.\-]+)\}')
TRAILING_COMMA_RE = re.compile(r',\s*[}\]]')  # a quick test before the character scan
# A spec name becomes the run directory's name and the prefix of every file in it, so it must be
# a plain file name: no path separators, no leading dot (hidden, or '..'), short enough that the
# longest file name made from it stays under the usual 255-byte limit.
SPEC_NAME_RE = re.compile(r'[A-Za-z0-9_\-][A-Za-z0-9_.\-]*')
SPEC_NAME_MAX_LEN = 128
# Sessions are processes and each writes its own files; more seeds than any study uses (papers
# report 3-10) is a typo or a fuzzed value, and 2**63 of them would never finish writing specs.
MAX_SESSIONS = 256
MAX_TRIALS = 1000
# torch takes seeds and thread counts as 64-bit integers (a larger one is a traceback); the seed
# bound leaves ample room below 2**63 for the per-session offsets added to it
MAX_SEED = 10**18
MAX_THREADS = 1024

ENV_SCHEMA = {
    'name': Field((str,), doc='gymnasium environment id, e.g. CartPole-v1'),
    'num_envs': Field((int,), 1, min=1, max=4096,
                      doc='parallel environments in one gymnasium.vector env (at most 4096: every one is stepped '
                          'by one process, or is a process of its own in async mode)'),
    'max_t': Field((int,), None, nullable=True, min=1,
                   doc="episode step limit (null: the env's own TimeLimit)"),
    'max_frame': Field((int,), min=1, doc='frames (env steps over all envs) in a session'),
    'normalize_obs': Field((bool,), False, doc='running mean/std observation normalisation'),
    'normalize_reward': Field((bool,), False, doc='scale rewards by a running std of the discounted return'),
    'vectorization_mode': Field((str,), 'sync', choices=('sync', 'async'),
                                doc='gymnasium.vector mode: sync (one process) or async (one process per env)'),
    'make_kwargs': Field((dict,), {}, doc='extra keyword arguments for gymnasium.make'),
    # SLM-Lab keys
    'reward_scale': Field((float, str), None, nullable=True, check=lambda v, p: _check_reward_scale(v, p),
                          doc='multiply training rewards by this number, or "sign": use their sign (SLM-Lab v4); '
                              "the recorded returns stay the env's own"),
    'normalize_state': Field((bool,), OMIT, planned={
        True: "SLM-Lab v4's running normalisation of observations by one scalar mean and std, "
              'where env.normalize_obs normalises each dimension'}, doc='(SLM-Lab v4) only false; see normalize_obs'),
    'frame_op': Field((str,), OMIT, nullable=True, choices=('concat',), planned={
        'stack': "frame stacking into (frame_op_len, ...) sequences, for SLM-Lab's RecurrentNet"},
        doc='(SLM-Lab v4) "concat": each observation is the last frame_op_len observations of its env joined '
            'end to end (the first of an episode repeated to fill), for vector observations; for Atari frames, '
            'the last frame_op_len 84x84 frames stacked (frame_op_len, 84, 84) (zeros before the first); null: '
            'none (Atari: 4 frames for ALE/ ids, 1 for the older ids)'),
    'frame_op_len': Field((int,), OMIT, nullable=True, min=1,
                          doc='(SLM-Lab v4) how many observations frame_op joins; needed with frame_op'),
    'image_downsize': Field((list,), OMIT, nullable=True, item_type=int, check=lambda v, p: _check_downsize(v, p),
                            doc='(SLM-Lab v4) Atari: the [width, height] frames are resized to (null: 84 x 84)'),
    'clip_obs': Field((float,), OMIT, nullable=True, min=0, min_exclusive=True,
                      doc='(SLM-Lab v5) clip observations to [-clip_obs, clip_obs], after normalize_obs when that '
                          'is on (absent: 10 with normalize_obs, else null; null: no clipping)'),
    'clip_reward': Field((float, list), OMIT, nullable=True, check=lambda v, p: _check_clip_reward(v, p),
                         doc='(SLM-Lab v5) clip training rewards to [-clip_reward, clip_reward] or to [min, max], '
                             'after normalize_reward when that is on (absent: 10 with normalize_reward, else null; '
                             "null: no clipping); the recorded returns stay the env's own"),
    'device': ignored_field("(SLM-Lab v5) the device of SLM-Lab's MuJoCo Playground envs; ignored for gymnasium "
                            'envs, as in SLM-Lab'),
    'life_loss_info': Field((bool,), OMIT,
                            doc='(SLM-Lab v5) Atari: a lost life ends the agent\'s episode (terminated) while the game '
                                'goes on, and the records count whole games\' returns; evaluation plays whole games'),
}
# env keys SLM-Lab reads for env families this lab does not have
ENV_PLANNED_KEYS = {'unity': "Unity environments (SLM-Lab v4's env.unity)"}

RUNTIME_META = ('experiment_ts', 'trial', 'session', 'git_sha', 'lab_version', 'spec_file', 'spec_name',
                'overrides', 'mode')

META_SCHEMA = {
    'distributed': Field((bool, str), False, choices=(False, 'shared', 'synced'),
                         doc='the sessions train one set of weights together, each in its own process (A3C-style, '
                             'SLM-Lab\'s): "shared": the sessions\' nets are the global nets in shared memory, '
                             'updated without locks (Hogwild); "synced": each session trains a local copy, steps the '
                             'global nets with its gradients and pulls them back; env.max_frame is split between the '
                             'sessions; false: independent sessions (see docs/resume.md, Distributed runs)'),
    'log_frequency': Field((int,), 1000, min=1, doc='frames between progress lines and CSV rows'),
    'eval_frequency': Field((int,), None, nullable=True, min=1,
                            doc='frames between evaluations (default: log_frequency)'),
    'rigorous_eval': Field((int,), 0, min=0,
                           doc='episodes of greedy play on a separate env at each eval (0: use training returns)'),
    'max_session': Field((int,), 1, min=1, max=MAX_SESSIONS,
                         doc='sessions (seeds) per trial, run in parallel processes, at most one per CPU core at once'),
    'max_trial': Field((int,), 1, min=1, max=MAX_TRIALS, doc='trials in a search (per grid point of a grid_search)'),
    'random_seed': Field((int,), None, nullable=True, min=0, max=MAX_SEED,
                         doc='base seed; session s of trial t uses random_seed + 1000*t + s (drawn when null)'),
    'checkpoint_frequency': Field((int,), None, nullable=True, min=1,
                                  doc='frames between snapshots of the whole session state (default: log_frequency)'),
    'keep_checkpoints': Field((int,), 2, min=1, doc='recent snapshots kept per session (plus best weights and the final one)'),
    'snapshot_replay': Field((bool,), False,
                             doc='include an off-policy replay memory in snapshots (else it refills after resume)'),
    'torch_num_threads': Field((int,), 1, min=1, max=MAX_THREADS, doc='torch intra-op threads per session'),
    # SLM-Lab keys for hardware and search: recorded; the search mode reads them
    'num_gpus': Field((int,), OMIT, nullable=True, min=0,
                      doc='(SLM-Lab v4) GPUs a search reserves per trial; recorded for search'),
    'search_resources': Field((dict,), OMIT, nullable=True, schema={
        'cpu': Field((float,), 1, min=0, min_exclusive=True, doc='CPUs per trial'),
        'gpu': Field((float,), 0, min=0, doc='GPUs per trial (a fraction shares one GPU)'),
    }, doc='(SLM-Lab v5) resources a search reserves per trial (default 1 CPU); read by search mode'),
    'search_scheduler': Field((dict,), OMIT, nullable=True, schema={
        'grace_period': Field((int,), 1, min=1, doc='frames a trial runs before it can be stopped'),
        'reduction_factor': Field((float,), 4, min=1, min_exclusive=True,
                                  doc='the fraction 1/reduction_factor of trials continues at each rung'),
    }, doc="(SLM-Lab v5) early stopping of a search's trials (ASHA on frames); read by search mode"),
    'search': ignored_field('(SLM-Lab v4) the search method name, e.g. "RandomSearch"; '
                            'SLM-Lab v4.2.4 does not read it either'),
    'train_mode': ignored_field('(SLM-Lab v4) not read by SLM-Lab v4.2.4 either; accepted and ignored'),
    # what SLM-Lab writes into the meta of the specs it saves (its spec_util.extend_meta_spec and
    # tick), so that a spec file SLM-Lab saved runs here too: the lab records its own run instead
    **{key: ignored_field(f'(set by SLM-Lab in the specs it saves: {what}) ignored; the lab records its own run')
       for key, what in (('experiment', 'experiment index'), ('resume', 'whether the run was resumed'),
                         ('cuda_offset', 'first GPU index'), ('prepath', 'output path prefix'),
                         ('predir', 'output directory'), ('graph_prepath', 'graph path prefix'),
                         ('info_prepath', 'info path prefix'), ('log_prepath', 'log path prefix'),
                         ('model_prepath', 'model path prefix'))},
    # filled by the lab and recorded in the saved specs
    'experiment_ts': Field((str,), None, nullable=True, doc='(set by the lab) run timestamp'),
    'trial': Field((int,), None, nullable=True, doc='(set by the lab) trial index'),
    'session': Field((int,), None, nullable=True, doc='(set by the lab) session index'),
    'git_sha': Field((str,), None, nullable=True, doc='(set by the lab) git commit of the lab'),
    'lab_version': Field((str,), None, nullable=True, doc='(set by the lab) lab version'),
    'spec_file': Field((str,), None, nullable=True, doc='(set by the lab) spec file the run was made from'),
    'spec_name': Field((str,), None, nullable=True, doc='(set by the lab) spec name'),
    'overrides': Field((list,), None, nullable=True, doc='(set by the lab) -s overrides applied'),
    'mode': Field((str,), None, nullable=True, doc='(set by the lab) lab mode'),
}

AGENT_KEYS = ('name', 'algorithm', 'memory', 'net')


# ---------------------------------------------------------------------------------------------
# reading

YAML_EXTS = ('.yaml', '.yml')
# A YAML file's aliases share one object however often they are used, but the spec built from it
# is expanded (merged, copied, written as JSON): a few nested aliases ("billion laughs") would
# expand to more values than any spec holds. SLM-Lab's largest YAML file has a few thousand.
MAX_SPEC_VALUES = 1_000_000
# Objects and lists inside each other: SLM-Lab's deepest spec (a torcharc arc) nests 7; the lab's
# recursive walks over a spec (placeholders, validation, diffs) stay far from Python's limit.
MAX_SPEC_DEPTH = 64
TOO_DEEP = object()


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
    import yaml

    class SpecLoader(yaml.SafeLoader):
        """Safe loader with YAML 1.2 exponent floats."""

    SpecLoader.add_implicit_resolver(
        'tag:yaml.org,2002:float',
        re.compile(r'^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$'), list('-+0123456789'))
    return SpecLoader


def _parse_yaml(text: str, spec_file: str) -> Any:
    import yaml
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


V4_BODY_PRODUCTS = ('outer', 'inner', 'custom')


def flatten_v4_layout(spec: dict) -> None:
    """SLM-Lab v4's layout made flat (v5's), in place: `agent` and `env` given as one-element lists
    are unwrapped, and the `body` block is checked and removed. `body` is SLM-Lab's multi-agent
    pairing of agents with envs (`product` of the agent and env lists, `num` bodies), which
    SLM-Lab v4 checks but no longer reads: with one agent in one env every product is that one
    pair. Several agents, envs or bodies are refused, naming the key."""
    for key in ('agent', 'env'):
        value = spec.get(key)
        if isinstance(value, list):
            if len(value) != 1:
                raise SpecError(f'{key}: a list of {len(value)} {key}s is SLM-Lab\'s multi-agent layout, which this '
                                f'lab does not have (one agent in one env); give one {key} object')
            spec[key] = value[0]
    if 'body' not in spec:
        return
    body = spec.pop('body')
    if not isinstance(body, dict):
        raise SpecError(f'body: expected an object such as {{"product": "outer", "num": 1}}, got '
                        f'{type(body).__name__} {body!r}')
    for key in body:
        if key not in ('product', 'num'):
            raise SpecError(f'body.{key}: unknown key{suggest(key, ("product", "num"))}; valid keys: product, num')
    product = body.get('product', 'outer')
    if product not in V4_BODY_PRODUCTS:
        raise SpecError(f'body.product: {product!r} is not valid{suggest(product, V4_BODY_PRODUCTS)}; valid values: '
                        f'{", ".join(V4_BODY_PRODUCTS)} (all mean the one agent-env pair here)')
    num = body.get('num', 1)
    if num not in (1, [1]) or isinstance(num, bool):
        raise SpecError(f'body.num: {json.dumps(num)} bodies is SLM-Lab\'s multi-agent layout, which this lab does '
                        'not have (one agent in one env); use "num": 1 or remove body')


# ---------------------------------------------------------------------------------------------
# overrides: -s KEY=VALUE

def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=3' -> ('a.b', 3). The value is read as JSON when it parses, else as a string."""
    if '=' not in text:
        raise SpecError(f"-s {text}: expected KEY=VALUE, e.g. -s env.max_frame=20000")
    key, raw = text.split('=', 1)
    key = key.strip()
    if not key:
        raise SpecError(f'-s {text}: the key is empty; expected KEY=VALUE')
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    except RecursionError:  # deeper than the JSON reader goes
        value = TOO_DEEP
    if value is TOO_DEEP or spec_depth_error(value) is not None:
        raise SpecError(f'-s {key}: the value nests objects or lists more than {MAX_SPEC_DEPTH} deep, '
                        'which no spec does; flatten it')
    return key, value


def _placeholder_paths(obj, path: str = '') -> list[tuple[str, str]]:
    """(name, key path) of every `${name}` placeholder in the string values of `obj`."""
    if isinstance(obj, str):
        return [(name, path) for name in PLACEHOLDER_RE.findall(obj)]
    if isinstance(obj, dict):
        return [found for k, v in obj.items() for found in _placeholder_paths(v, f'{path}.{k}' if path else k)]
    if isinstance(obj, list):
        return [found for i, v in enumerate(obj) for found in _placeholder_paths(v, f'{path}.{i}')]
    return []


def _placeholders(obj) -> set:
    return {name for name, _ in _placeholder_paths(obj)}


def _placeholder_text(value: Any) -> str:
    """A -s value as it reads inside a longer string: `max_frame=1e7` in "run_${max_frame}" gives
    "run_10000000" (an integral number without its float form), true gives "true", as in JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def _substitute(obj, values: dict):
    """`obj` with each filled placeholder replaced. A string that is one placeholder takes the
    -s value itself, so `"max_frame": "${max_frame}"` with -s max_frame=1e7 holds a number."""
    if isinstance(obj, str):
        whole = PLACEHOLDER_RE.fullmatch(obj)
        if whole and whole.group(1) in values:
            return copy.deepcopy(values[whole.group(1)])
        return PLACEHOLDER_RE.sub(
            lambda m: _placeholder_text(values[m.group(1)]) if m.group(1) in values else m.group(0), obj)
    if isinstance(obj, dict):
        return {k: _substitute(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_substitute(v, values) for v in obj]
    return obj


def set_by_path(spec: dict, path: str, value: Any) -> None:
    """Set spec[a][b][c] = value for path 'a.b.c'; list elements by index ('hid_layers.0')."""
    parts = path.split('.')
    node = spec
    for i, part in enumerate(parts[:-1]):
        node = _child(node, part, '.'.join(parts[:i + 1]), create=True)
    last = parts[-1]
    if isinstance(node, list):
        idx = _index(node, last, path)
        node[idx] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise SpecError(f'-s {path}: {".".join(parts[:-1])} is not an object')


def _index(node: list, part: str, path: str) -> int:
    if not part.lstrip('-').isdigit() or not -len(node) <= int(part) < len(node):
        raise SpecError(f'-s {path}: {part} is not a valid index of a list of {len(node)}')
    return int(part)


def _child(node, part: str, path: str, create: bool):
    if isinstance(node, list):
        return node[_index(node, part, path)]
    if not isinstance(node, dict):
        raise SpecError(f'-s {path}: cannot descend into a {type(node).__name__}')
    if part not in node or node[part] is None:
        if not create:
            raise SpecError(f'{path}: not in the spec')
        node[part] = {}
    return node[part]


def apply_overrides(spec: dict, overrides: list[str]) -> dict:
    """Apply `-s KEY=VALUE` overrides: a KEY used as a `${KEY}` placeholder in the spec is
    substituted there; any other KEY is a dotted spec path. Unfilled placeholders are an error."""
    spec = copy.deepcopy(spec)
    pairs = [parse_override(o) for o in overrides or []]
    holes = _placeholders(spec)
    values = {k: v for k, v in pairs if k in holes}
    spec = _substitute(spec, values)
    for key, value in pairs:
        if key not in holes:
            set_by_path(spec, key, value)
    missing = {}
    for name, where in _placeholder_paths(spec):
        missing.setdefault(name, where)
    if missing:
        holes_at = ', '.join(f'${{{name}}} at {where}' for name, where in sorted(missing.items()))
        fill = ' '.join(f'-s {name}=VALUE' for name in sorted(missing))
        raise SpecError(f'the spec has unfilled placeholder(s) {holes_at}; fill them with {fill}')
    return spec


# ---------------------------------------------------------------------------------------------
# validation

def _check_env_name(name: str, path: str) -> None:
    import gymnasium as gym
    from slm_lab.env import ensure_env_registered
    ensure_env_registered(name)
    if name not in gym.envs.registry:
        raise SpecError(f"{path}: '{name}' is not a registered gymnasium environment"
                        f'{suggest(name, list(gym.envs.registry))}; e.g. CartPole-v1, Pendulum-v1')
    from slm_lab.env import warn_if_outdated
    warn_if_outdated(name)


ENV_SCHEMA['name'].check = _check_env_name


def _check_reward_scale(value, path: str) -> None:
    if isinstance(value, str) and value != 'sign':
        raise SpecError(f'{path}: {value!r} is not valid; give a number, "sign" or null')


def _check_clip_reward(value, path: str) -> None:
    if isinstance(value, list):
        if len(value) != 2 or not all(_is_number(x) for x in value) or not value[0] < value[1]:
            raise SpecError(f'{path}: {value!r} is not valid; give a bound b > 0 (clips to [-b, b]), '
                            '[min, max] with min < max, or null')
    elif value <= 0:
        raise SpecError(f'{path}: {value!r} is out of range; a bound must be > 0 (or give [min, max])')


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fill_env_clip_defaults(env: dict) -> dict:
    """SLM-Lab v5's defaults of clip_obs and clip_reward, written into the validated env spec so
    the saved spec says what ran: 10 when the matching normalisation is on, else null (an explicit
    null, kept, turns clipping off); rewards of ALE/ games (SLM-Lab v5's Atari ids) clipped to 1."""
    env.setdefault('clip_obs', 10.0 if env['normalize_obs'] else None)
    ale = isinstance(env.get('name'), str) and env['name'].startswith('ALE/')
    env.setdefault('clip_reward', 1.0 if ale else 10.0 if env['normalize_reward'] else None)
    return env


def check_frame_op(env: dict) -> None:
    """frame_op needs frame_op_len (SLM-Lab v4 gives both or neither); life_loss_info is for the
    frames of an Atari game."""
    if env.get('frame_op') and env.get('frame_op_len') is None:
        raise SpecError(f'env.frame_op_len: env.frame_op "{env["frame_op"]}" needs frame_op_len, the number of '
                        'observations to join (SLM-Lab used 4); set it, or set frame_op to null')
    from slm_lab.env import ENV_FAMILIES, atari_frames, env_family
    if env.get('life_loss_info') and atari_frames(env) is None:
        if env_family(env['name']) is ENV_FAMILIES['atari'] and \
                {**env, **(env.get('make_kwargs') or {})}.get('obs_type') == 'ram':
            raise SpecError("env.life_loss_info: true is for Atari games' image observations, not obs_type 'ram' "
                            f"({env['name']!r}); remove it, set it to false, or drop obs_type ram")
        raise SpecError(f"env.life_loss_info: true is for Atari games with image observations and a fixed frame "
                        f"skip (ALE/*-v5, *NoFrameskip-v4), not {env['name']!r}; remove it or set it to false")
    if env.get('image_downsize') and env_family(env['name']) is not ENV_FAMILIES['atari']:
        raise SpecError(f"env.image_downsize: resizes Atari frames, and {env['name']!r} is not an Atari game; remove "
                        'it or set it to null')


@accepts('[width, height], each >= 1')
def _check_downsize(value, path):
    if len(value) != 2 or min(value) < 1:
        raise SpecError(f'{path}: {value!r} is not a frame size; give [width, height], e.g. [84, 84]')


def env_constructor_args(name: str) -> list[str] | None:
    """The keyword arguments the constructor of gymnasium env `name` takes (its entry point's
    signature, plus the kwargs its registration passes), or None when it takes any (**kwargs) or
    cannot be loaded here (a missing optional package is reported when the env is built)."""
    import inspect
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator
    env_spec = gym.envs.registry.get(name)
    if env_spec is None or env_spec.entry_point is None:
        return None
    try:
        creator = env_spec.entry_point if callable(env_spec.entry_point) else load_env_creator(env_spec.entry_point)
        params = inspect.signature(creator.__init__ if inspect.isclass(creator) else creator).parameters
    except Exception:  # noqa: BLE001 - any import failure of an optional env family: checked at build time
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    names = [k for k, p in params.items() if k != 'self' and p.kind in
             (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return names + [k for k in env_spec.kwargs if k not in names]


def check_env_kwargs(env: dict, path: str = 'env') -> None:
    """Env keys that are not the lab's own go to gymnasium.make as keyword arguments of the env
    (SLM-Lab v5's rule, e.g. `"continuous": true` for LunarLander-v3); each must be an argument
    of that env's constructor. A misspelt lab key is named with its likely spelling."""
    extra = [k for k in env if k not in ENV_SCHEMA]
    if not extra:
        return
    args = env_constructor_args(env['name'])
    if args is None:
        return
    for key in extra:
        if key not in args:
            raise SpecError(f"{path}.{key}: not a key of env and not an argument of {env['name']}'s constructor"
                            f'{suggest(key, list(ENV_SCHEMA) + args)}; env keys: {", ".join(ENV_SCHEMA)}; '
                            f"{env['name']} arguments: {', '.join(args) or '(none)'}")


AGENT_SCHEMA = {  # the keys of spec.agent
    'name': Field((str,), None, nullable=True, doc='agent name (free text; default: the algorithm name)'),
    'algorithm': Field((dict,), doc='the algorithm'),
    'memory': Field((dict,), None, nullable=True, doc='the memory'),
    'net': Field((dict,), None, nullable=True, doc='the network'),
    'critic_net': Field((dict,), OMIT, nullable=True,
                        doc="(SLM-Lab v5) CrossQ: the critics' net (any net type), else agent.net's"),
}


def _component_schema(section: str, registry: dict, planned: tuple, spec: Any, path: str):
    """The schema of the component named in spec['name'] (or spec['type'] for nets)."""
    name_key = 'type' if section == 'net' else 'name'
    if not isinstance(spec, dict):
        raise SpecError(f'{path}: expected an object, got {type(spec).__name__} {spec!r}')
    if name_key not in spec:
        raise SpecError(f'{path}.{name_key}: required key is missing; valid {section} {name_key}s: '
                        f'{", ".join(registry)}')
    name = spec[name_key]
    if not isinstance(name, str):  # an object or list here would be unhashable below
        raise SpecError(f'{path}.{name_key}: expected a string, got {type(name).__name__} {name!r}; '
                        f'valid {section} {name_key}s: {", ".join(registry)}')
    if name in registry:
        return registry[name]
    if name in planned:
        raise not_available(f'{path}.{name_key}', f"SLM-Lab's {section} '{name}'", f'; available: {", ".join(registry)}')
    raise SpecError(f"{path}.{name_key}: unknown {section} '{name}'{suggest(name, list(registry) + list(planned))}; "
                    f'valid: {", ".join(registry)}')


def validate_spec(spec: dict, spec_name: str = 'spec') -> dict:
    """Validate a raw spec and return it with every default filled in. Raises SpecError naming
    the key path of the first problem and the valid choices."""
    from slm_lab.agent.algorithm import ALGORITHMS, PLANNED_ALGORITHMS
    from slm_lab.agent.algorithm import PLANNED_KEYS as PLANNED_ALGORITHM_KEYS
    from slm_lab.agent.memory import MEMORIES, PLANNED_MEMORIES
    from slm_lab.agent.memory import PLANNED_KEYS as PLANNED_MEMORY_KEYS
    from slm_lab.agent.net import NETS, PLANNED_NETS
    from slm_lab.agent.net import PLANNED_KEYS as PLANNED_NET_KEYS

    if not isinstance(spec, dict):
        raise SpecError(f'{spec_name}: a spec must be a JSON object')
    spec = copy.deepcopy(spec)
    spec.pop('name', None)
    # NaN and Infinity (which Python's json reads, as it reads 1e400) pass every range check and
    # would reach torch or numpy; free-form objects such as optim_spec or make_kwargs included
    check_finite(spec)
    flatten_v4_layout(spec)  # SLM-Lab v4's list-wrapped agent and env, and its body block
    top = {
        'agent': Field((dict,), doc='the agent: algorithm, memory and net'),
        'env': Field((dict,), doc='the environment'),
        'meta': Field((dict,), {}, doc='run settings'),
        'search': Field((dict,), None, nullable=True, doc='hyperparameter search space: what search mode draws'),
        'spec_params': Field((dict,), OMIT, doc="(SLM-Lab v4) the values of the spec's ${...} placeholders its "
                                                'benchmarks ran; here each run fills them with -s; recorded'),
    }
    spec = check_object(spec, top, 'spec')
    from slm_lab.env import rename_env_id  # gymnasium ids renamed since SLM-Lab v4 run their current id
    spec['env'] = check_object(rename_env_id(spec['env']), ENV_SCHEMA, 'env', extra_ok=lambda k: k not in ENV_PLANNED_KEYS,
                               planned_keys=ENV_PLANNED_KEYS)
    check_env_kwargs(spec['env'])
    check_frame_op(spec['env'])
    fill_env_clip_defaults(spec['env'])
    spec['meta'] = check_object(spec['meta'], META_SCHEMA, 'meta')
    agent = spec['agent']
    if isinstance(agent, dict) and isinstance(agent.get('algorithm'), dict):  # a later algorithm's keys wait for it
        _component_schema('algorithm', ALGORITHMS, PLANNED_ALGORITHMS, agent['algorithm'], 'agent.algorithm')
    agent = check_object(agent, AGENT_SCHEMA, 'agent')
    algo_cls = _component_schema('algorithm', ALGORITHMS, PLANNED_ALGORITHMS, agent['algorithm'], 'agent.algorithm')
    agent['algorithm'] = check_object(agent['algorithm'], algo_cls.spec_schema, 'agent.algorithm',
                                      planned_keys=PLANNED_ALGORITHM_KEYS)
    if agent['name'] is None:
        agent['name'] = agent['algorithm']['name']
    for section, registry, planned, planned_keys in (('memory', MEMORIES, PLANNED_MEMORIES, PLANNED_MEMORY_KEYS),
                                                     ('net', NETS, PLANNED_NETS, PLANNED_NET_KEYS)):
        required = section in algo_cls.requires
        if agent[section] == {} and not required:  # SLM-Lab's "net": {} for an agent without one
            agent[section] = None
        if agent[section] is None:
            if required:
                raise SpecError(f"agent.{section}: {algo_cls.__name__} needs a {section}; "
                                f'valid: {", ".join(registry)}')
            continue
        cls = _component_schema(section, registry, planned, agent[section], f'agent.{section}')
        schema = cls.spec_schema
        if section == 'memory':  # keys an algorithm reads in its memory's section (SIL's replay)
            schema = {**schema, **algo_cls.memory_schema}
        agent[section] = check_object(agent[section], schema, f'agent.{section}', planned_keys=planned_keys)
    if agent.get('critic_net') is not None:
        if not algo_cls.uses_critic_net:
            raise SpecError(f'agent.critic_net: {algo_cls.__name__} has no separate critic net (CrossQ reads it); '
                            'remove agent.critic_net, or describe the critic in agent.net')
        cls = _component_schema('net', NETS, PLANNED_NETS, agent['critic_net'], 'agent.critic_net')
        agent['critic_net'] = check_object(agent['critic_net'], cls.spec_schema, 'agent.critic_net',
                                           planned_keys=PLANNED_NET_KEYS)
    planned_memory = algo_cls.planned_memory_names.get((agent['memory'] or {}).get('name'))
    if planned_memory:
        raise not_available('agent.memory.name', planned_memory, f'; use one of: {", ".join(algo_cls.memory_names)}')
    if agent['memory'] is not None and algo_cls.memory_names is not None \
            and agent['memory']['name'] not in algo_cls.memory_names:
        raise SpecError(f"agent.memory.name: {algo_cls.__name__} cannot use '{agent['memory']['name']}'; "
                        f'use one of: {", ".join(algo_cls.memory_names)}')
    spec['agent'] = agent
    algo_cls.check_spec(spec)
    return spec


def load_raw_spec(spec_file: str, spec_name: str, overrides: list[str] | None = None) -> dict:
    """The named spec with overrides applied, before defaults and validation."""
    raw = get_raw_spec(spec_file, spec_name)
    flatten_v4_layout(raw)  # so that -s agent.x / env.x paths work on SLM-Lab v4 list specs too
    if isinstance(raw.get('meta'), dict):
        # a spec the lab saved in a run directory records that run (its timestamp, session index,
        # overrides...); run again, it starts a new run, which records its own
        raw['meta'] = {k: v for k, v in raw['meta'].items() if k not in RUNTIME_META}
    return apply_overrides(raw, overrides or [])


def merge_specs(base: dict, over: dict) -> dict:
    """`base` with every key that `over` gives replaced by `over`'s value (objects merged key by
    key). Resuming fills what the spec file leaves out from the run's saved spec, so a default
    that changed in a newer lab does not change an older run."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_specs(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_spec(spec_file: str, spec_name: str, overrides: list[str] | None = None,
              base: dict | None = None) -> dict:
    """Read, override and validate a spec (keys it omits filled from `base` when given, then
    from the defaults); record its origin in meta."""
    raw = load_raw_spec(spec_file, spec_name, overrides)
    if base is not None:
        base = {k: v for k, v in base.items() if k != 'name'}
        base['meta'] = {k: v for k, v in base.get('meta', {}).items() if k not in RUNTIME_META}
        raw = merge_specs(base, raw)
    spec = validate_spec(raw, spec_name)
    spec['name'] = spec_name
    spec['meta']['spec_file'] = os.path.abspath(spec_file)
    spec['meta']['spec_name'] = spec_name
    spec['meta']['overrides'] = list(overrides or [])
    return spec


def diff_specs(old: Any, new: Any, path: str = '') -> list[tuple[str, Any, Any]]:
    """Key paths whose values differ between two specs: [(path, old, new)]."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            sub = f'{path}.{key}' if path else key
            out += diff_specs(old.get(key), new.get(key), sub)
        return out
    return [] if old == new else [(path, old, new)]


def session_max_frame(spec: dict, n_sessions: int | None = None) -> int:
    """The frames each session of a trial runs: env.max_frame, or with meta.distributed (and more
    than one session) its share int(env.max_frame / n_sessions), as in SLM-Lab. `n_sessions`: the
    sessions the trial runs (default meta.max_session; a dev run runs one)."""
    n = spec['meta']['max_session'] if n_sessions is None else n_sessions
    max_frame = spec['env']['max_frame']
    return int(max_frame / n) if spec['meta'].get('distributed') and n > 1 else int(max_frame)
