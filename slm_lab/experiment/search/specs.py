"""A search's spec: the search extra installed, the parameters its search block draws, each trial's
spec and the spec a resumed search continues under."""
from __future__ import annotations

import copy
import importlib.util
import json
import socket

from slm_lab.experiment.search.space import Param, grid_points, parse_search
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import LabError, ResumeError, SpecError
from slm_lab.lib.io import write_json
from slm_lab.persistence import edits
from slm_lab.persistence.run_dir import RunDir
from slm_lab.spec import RUNTIME_META, diff_specs, set_by_path, validate_spec

logger = lab_logger.get_logger('slm_lab.search')
INSTALL = 'pip install -r requirements-search.txt  (or: pip install ".[search]")'


def check_installed(mode: str = 'search') -> None:
    """Ray Tune and Optuna are the search extra (search mode's, and benchmark mode's, which runs its
    trials on the same engine); a one-line error names its install command."""
    missing = [name for name in ('ray', 'optuna') if importlib.util.find_spec(name) is None]
    if missing:
        raise SpecError(f'{mode} mode needs {" and ".join(missing)} (the search extra), which is not installed; '
                        f'install it with: {INSTALL}')


# ---------------------------------------------------------------------------------------------
# the spaces, the trials' specs

# keys SLM-Lab's experimental search blocks (lunar_pg.json, mountain_car.json) still search, from
# versions before v4, which neither SLM-Lab v4 nor v5 reads: searched there, they changed nothing
UNREAD_SEARCH_KEYS = {
    'agent.algorithm.clip_eps': "SLM-Lab's old name of clip_eps_spec",
    'agent.algorithm.entropy_coef': "SLM-Lab's old name of entropy_coef_spec",
    'agent.net.lr_decay_frequency': "SLM-Lab's old learning-rate decay key (lr_scheduler_spec since v4)",
    'agent.net.lr_anneal_timestep': "SLM-Lab's old learning-rate annealing key (lr_scheduler_spec since v4)",
}


def search_params(spec: dict) -> list[Param]:
    """The searched keys of a validated spec, each value they can take checked against the spec."""
    if spec.get('search') is None:
        raise SpecError(f"search: spec '{spec['name']}' has no search block, so search mode has nothing to draw; "
                        'add one (e.g. "search": {"agent.algorithm.gamma__uniform": [0.9, 0.999]}) or use train')
    params = []
    unread = dict(UNREAD_SEARCH_KEYS)
    searched = parse_search(spec['search'])
    net = spec['agent'].get('net') or {}
    if net.get('type') == 'RecurrentNet':  # SLM-Lab's recurrent specs search it
        unread['agent.net.hid_layers'] = "MLPNet's layers key, which a RecurrentNet has not (its dense layers are " \
                                         'fc_hid_layers)'
    if net.get('shared') or net.get('use_same_optim'):  # SLM-Lab's a3c_cartpole.json searches it on shared nets
        why = 'shared: true (one optimizer, from actor_optim_spec)' if net.get('shared') else \
            "use_same_optim: true (the critic's optimizer is made from actor_optim_spec)"
        unread.update({p.path: f"the critic's optimizer key, unused by a net with {why}" for p in searched
                       if p.path.startswith('agent.net.critic_optim_spec.')})
    for p in searched:
        if p.path in unread:
            lab_logger.warn_once('slm_lab.search', f'search.{p.key}: {p.path} is {unread[p.path]}, which SLM-Lab v4 '
                       'and v5 do not read '
                       'either (searching it changed nothing there); this search leaves it out')
        else:
            params.append(p)
    for p in params:
        # a value is refused when it fits neither the spec as it is nor with any one other searched
        # key at one of its extremes: a start_step searched beside its end_step may pass the spec's
        # end_step (SLM-Lab's pendulum.json does); a trial that draws a pair that does not fit fails
        # alone, with its line in the search's log
        others = [{}] + [{q.path: v} for q in params if q is not p for v in q.extremes()]
        for value in p.extremes():
            error = None
            for other in others:
                try:
                    trial_spec(spec, {**other, p.path: value}, 0)
                    error = None
                    break
                except SpecError as e:
                    error = error or e
            if error is not None:
                raise SpecError(f'search.{p.key}: the value {json.dumps(value)} does not fit the spec: {error}')
    return params


def trial_spec(spec: dict, values: dict, index: int) -> dict:
    """Trial `index`'s spec: the search spec without its search block, `values` ({path: value})
    set, validated."""

    raw = copy.deepcopy(spec)
    raw.pop('search', None)
    name = raw.pop('name')
    kept = {k: raw['meta'].pop(k) for k in list(raw['meta']) if k in RUNTIME_META}
    for path, value in values.items():
        set_by_path(raw, path, copy.deepcopy(value))
    out = validate_spec(raw, name)
    out['name'] = name
    out['meta'].update(kept)
    out['meta']['trial'] = index
    return out


def write_trial_specs(run_dir: RunDir, spec: dict, values: dict, index: int) -> None:
    """{name}_t{i}_spec.json and its sessions' specs, as train writes them (kept when a resumed
    search finds them: they hold what the trial drew)."""
    from slm_lab.experiment.trial import Trial  # noqa: PLC0415 imports torch: the search driver does not otherwise
    if run_dir.spec_path(index).exists():
        return
    trial = Trial(trial_spec(spec, values, index), run_dir, 'train', trial=index)
    for s in range(trial.max_session):
        write_json(run_dir.spec_path(index, s), trial.session_spec(s))
    write_json(run_dir.spec_path(index), trial.session_spec(None))  # last: its presence means all are there


def read_trial_spec(run_dir: RunDir, index: int) -> dict:
    """Trial `index`'s spec as the search wrote it, with what a newer lab added since filled in as
    the trial started (edits.fill_keys_added_later: a search resumed by a newer lab continues each
    trial as it trained, as train@ continues a run) and this lab's other defaults (validated)."""
    path = run_dir.spec_path(index)
    try:
        saved = json.loads(path.read_text())
        spec = validate_spec(edits.fill_keys_added_later({k: v for k, v in saved.items() if k != 'name'}),
                             run_dir.spec_name)
    except (OSError, ValueError, AttributeError, LabError) as e:  # ValueError: JSON; AttributeError: not an object
        raise ResumeError(f'{path}: the trial\'s spec cannot be read ({e}); the trial cannot run without it') from None
    spec['name'] = saved.get('name', run_dir.spec_name)
    return spec


def total_trials(spec: dict, params: list[Param]) -> int:
    """max_trial trials per grid point (Ray Tune's num_samples with grid_search)."""
    return spec['meta']['max_trial'] * len(grid_points(params))


SEARCH_EDITS = ('meta.max_trial', 'meta.log_frequency', 'meta.eval_frequency', 'meta.checkpoint_frequency',
                'meta.keep_checkpoints', 'meta.torch_num_threads')


def resume_spec(spec_file: str, spec_name: str, overrides: list[str] | None, old_spec: dict, force: bool,
                mode: str) -> tuple[dict, list[Param]]:
    """The spec a resumed search continues under: the spec file (with the search's own -s
    overrides, then these), keys it leaves out taken from the search's saved spec. Edits other
    than SEARCH_EDITS are refused with the list of them (unless force); max_trial cannot drop."""
    spec, old_spec = edits.continuation_spec(spec_file, spec_name, overrides, old_spec, mode)
    meta = spec['meta']
    diff = [d for d in diff_specs(old_spec, spec) if not d[0].startswith(edits.IGNORED) and d[0] != 'name']
    if meta['random_seed'] != old_spec['meta']['random_seed']:
        diff.append(('meta.random_seed', old_spec['meta']['random_seed'], meta['random_seed']))
    if meta['max_trial'] < old_spec['meta']['max_trial']:
        raise ResumeError(f"meta.max_trial: {old_spec['meta']['max_trial']} -> {meta['max_trial']}: a search "
                          f"cannot lose trials; use meta.max_trial >= {old_spec['meta']['max_trial']}")
    bad = [d for d in diff if d[0] not in SEARCH_EDITS]
    if bad and not force:
        changes = '; '.join(f'{k}: {o!r} -> {n!r}' for k, o, n in bad)
        raise ResumeError(f"the spec changed in ways that break the search's continuity: {changes}; revert them "
                          f'(a search resumes with more trials, meta.max_trial, or other frequencies), or pass '
                          '--force to resume anyway')
    return spec, search_params(spec)


def check_ray_address(address: str) -> None:
    """A --ray-address (or RAY_ADDRESS) must answer before anything is written."""
    if address == 'auto':
        return
    hostport = address.split('://', 1)[-1]
    host, _, port = hostport.rpartition(':')
    if not host or not port.isdigit():
        raise LabError(f'--ray-address {address}: expected HOST:PORT of a Ray head node (e.g. 127.0.0.1:6379), '
                       'or auto')
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        raise LabError(f'--ray-address {address}: no Ray cluster answers there ({type(e).__name__}: {e}); start '
                       'one (ray start --head) or leave --ray-address out to run on this machine') from None
