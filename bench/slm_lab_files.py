"""Run SLM-Lab's own spec files through the lab, as a user bringing them would, and count the outcomes.

    python bench/slm_lab_files.py DIR [DIR ...]            # check every spec of every file
    python bench/slm_lab_files.py DIR --train              # and train each one that checks out
    python bench/slm_lab_files.py DIR --later              # and count what the later ones wait for

DIR is a copy of SLM-Lab's spec directory at some version (e.g. `git archive v4.2.4 slm_lab/spec`
of https://github.com/kengz/SLM-Lab, unpacked; this repository ships none of SLM-Lab's files).
Every `*.json` / `*.yaml` file under DIR whose name does not start with `_` is read; each spec is
validated with its `${var}` placeholders filled (`env` with CartPole-v1, or ALE/Pong-v5 for an Atari spec,
anything else with 10000),
as `-s var=...` would. Outcomes:

  ok          the spec validates (with --train: and trains --frames frames, exit code 0)
  later       refused with the one 'not available yet' line (a component of a later version)
  refused     refused with another one-line error (printed: an env that cannot be installed here, a
              multi-agent layout, ... or something to fix)
  traceback   a bug (printed)
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def placeholder_overrides(spec: dict) -> list[str]:
    """-s values for a spec's ${var} placeholders: `env` an Atari game for a spec of Atari's
    (a ConvNet, life_loss_info, sticky actions), else CartPole-v1; anything else 10000."""
    text = json.dumps(spec)
    holes = sorted(set(re.findall(r'\$\{(\w+)\}', text)))
    atari = any(k in text for k in ('ConvNet', 'life_loss_info', 'repeat_action_probability', 'conv2d', 'Conv2d'))
    env = 'ALE/Pong-v5' if atari else 'CartPole-v1'
    return [f'{h}={env}' if h == 'env' else f'{h}=10000' for h in holes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('dirs', nargs='+', help="directories holding SLM-Lab's spec files")
    parser.add_argument('--train', action='store_true', help='train each spec that validates')
    parser.add_argument('--later', action='store_true',
                        help="also count the 'not available yet' lines by the component they name")
    parser.add_argument('--frames', type=int, default=300, help='frames to train with --train (300)')
    parser.add_argument('--search', action='store_true',
                        help="also check the search block of each spec that validates (search mode's spaces and "
                             'every value they can take); with --train, run a 2-trial search of each')
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # renamed-env warnings and the like: the outcome is what counts
    from slm_lab.lib.errors import LabError
    from slm_lab.spec import load_spec, read_spec_file

    files = sorted(p for d in args.dirs for p in Path(d).rglob('*')
                   if p.suffix in ('.json', '.yaml', '.yml') and not p.name.startswith('_'))
    counts, notes, later = collections.Counter(), [], collections.Counter()
    with tempfile.TemporaryDirectory() as work:
        for path in files:
            try:
                specs = read_spec_file(str(path))
            except LabError as e:
                counts['refused'] += 1
                notes.append(f'refused   {path}: {e}')
                continue
            for name, spec in specs.items():
                if name.startswith('_'):
                    continue
                overrides = placeholder_overrides(spec)
                try:
                    loaded = load_spec(str(path), name, overrides)
                except LabError as e:
                    kind = 'later' if 'not available yet' in str(e) else 'refused'
                    counts[kind] += 1
                    if kind == 'refused':
                        notes.append(f'refused   {path} {name}: {e}')
                    else:
                        later[str(e).split(' is not available yet')[0]] += 1
                    continue
                except Exception as e:  # a bug in the lab
                    counts['traceback'] += 1
                    notes.append(f'traceback {path} {name}: {type(e).__name__}: {e}')
                    continue
                if args.search and loaded.get('search'):
                    from slm_lab.experiment.search.specs import search_params
                    try:
                        search_params(loaded)
                        counts['search ok'] += 1
                    except LabError as e:
                        counts['search refused'] += 1
                        notes.append(f'search    {path} {name}: {e}')
                    except Exception as e:  # a bug in the lab
                        counts['search traceback'] += 1
                        notes.append(f'search traceback {path} {name}: {type(e).__name__}: {e}')
                if args.train:
                    sets = overrides + [f'env.max_frame={args.frames}', 'meta.log_frequency=100',
                                        'meta.eval_frequency=100', 'meta.max_session=1', 'meta.rigorous_eval=0']
                    cmd = [sys.executable, str(ROOT / 'run_lab.py'), str(path.resolve()), name, 'train']
                    cmd += [a for s in sets for a in ('-s', s)]
                    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
                    if done.returncode != 0:
                        counts['failed to train'] += 1
                        last = (done.stderr.strip().splitlines() or [''])[-1]
                        notes.append(f'train     {path} {name}: exit {done.returncode}: {last}')
                        continue
                counts['ok'] += 1
    for note in notes:
        print(note)
    if args.later:
        for what, n in later.most_common():
            print(f'later {n:4d}  {what}')
    total = sum(counts.values())
    print(f'{total} specs in {len(files)} files: ' + ', '.join(f'{k} {v}' for k, v in counts.most_common()))


if __name__ == '__main__':
    main()
