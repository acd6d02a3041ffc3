"""Weights & Biases tracking of a run (meta.wandb, off by default; the optional wandb package:
pip install '.[wandb]'): one W&B run per session, with the scalars TensorBoard shows
(slm_lab.experiment.scalars) at the same log and eval points, at step = the frame.

A session's W&B run is named `{spec_name}_t{trial}_s{session}`, grouped by the run directory's
name, and holds the session's resolved spec as its config. Its id is kept in
`info/{spec_name}_t{trial}_s{session}_wandb.json`, so train@ continues the same W&B run
(`wandb.init(id=..., resume='allow')`). Its files are under `{run_dir}/wandb/`.

W&B's history only grows (a step below the run's last one is dropped), so a session sends W&B
the rows of its records that W&B lacks: those past the last step W&B holds for the run. What a
stopped or killed run logged past its snapshot stays in W&B (an exact resume logs the same rows
again, bar timings), and what a killed run had not yet handed to W&B (its buffered tail) is sent
from the records at the resume. Online, W&B's server says which step it holds; offline, each
start writes a new offline run directory with the same id, and the lab reads the last step of
the earlier ones with W&B's own reader (`wandb leet inspect`), so that `wandb sync` of
`{run_dir}/wandb` uploads one continuous history.
"""
from __future__ import annotations

import importlib.util
import json
import netrc
import os
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from slm_lab.experiment.scalars import frame_points, rows_through
from slm_lab.lib import logger as lab_logger
from slm_lab.lib.errors import SpecError
from slm_lab.lib.io import read_json, write_json
from slm_lab.persistence.run_dir import RunDir

logger = lab_logger.get_logger('slm_lab.session')
DEFAULT_PROJECT = 'slm-lab'
MODE_ALIASES = {'dryrun': 'offline', 'run': 'online'}  # older spellings W&B still reads in WANDB_MODE


def wandb_options(meta: dict) -> dict | None:
    """The W&B settings meta.wandb asks for (project, entity, mode, group, tags), or None when off."""
    value = meta.get('wandb', False)
    if not value:
        return None
    options = {'project': None, 'entity': None, 'mode': None, 'group': None, 'tags': None}
    if isinstance(value, dict):
        options.update(value)
    return options


def require_wandb(meta: dict) -> None:
    """SpecError when meta.wandb is on and the wandb package is missing (checked without importing it)."""
    if wandb_options(meta) is not None and importlib.util.find_spec('wandb') is None:
        raise SpecError("meta.wandb is on (or --track) but the wandb package is not installed: "
                        "pip install '.[wandb]' (or pip install -r requirements-wandb.txt), or leave meta.wandb false")


def has_credentials(settings) -> bool:
    """Whether W&B would find credentials here without asking: an API key in WANDB_API_KEY or W&B's
    settings files, an identity token file, or a .netrc entry for its server (what `wandb login`
    writes). Checked without a network call."""
    if settings.api_key or os.environ.get('WANDB_IDENTITY_TOKEN_FILE'):
        return True
    host = urlparse(settings.base_url).hostname
    try:
        return netrc.netrc(os.environ.get('NETRC')).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(spec_mode: str | None, settings) -> tuple[str, str | None]:
    """(mode, why it is offline when online was asked for, else None). The mode: WANDB_MODE, else
    meta.wandb.mode, else W&B's own setting (`wandb offline`), else online; online becomes offline
    when W&B has no credentials here (nothing would reach W&B, and W&B would ask for a key)."""
    mode = os.environ.get('WANDB_MODE') or spec_mode or settings.mode or 'online'
    mode = MODE_ALIASES.get(mode, mode)
    if mode == 'online' and not has_credentials(settings):
        return 'offline', 'W&B has no API key configured (WANDB_API_KEY or wandb login)'
    return mode, None


def last_offline_step(wandb_dir: Path, run_id: str, current: Path | None) -> int:
    """The last history step the earlier offline run directories of `run_id` hold (-1: none), newest
    first, read with W&B's own reader of its transaction logs."""
    for run_path in sorted(wandb_dir.glob(f'offline-run-*-{run_id}'), reverse=True):
        if current is not None and run_path.resolve() == current.resolve():
            continue
        done = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--summary', '--json', str(run_path)],
                              capture_output=True, text=True, timeout=120)
        try:
            step = json.loads(done.stdout).get('step')
        except ValueError:
            step = None
        if isinstance(step, int):
            return step
    return -1


class WandbBoard:
    """The W&B run of one session (see the module docstring): `sync` after each record row sends
    the rows W&B lacks; `close` finishes the W&B run. Off (meta.wandb false): does nothing."""

    def __init__(self, spec: dict, run_dir: RunDir, trial: int, session: int):
        self.spec, self.run_dir = spec, run_dir
        self.options = wandb_options(spec['meta'])
        self.enabled = self.options is not None
        self.name = run_dir.prename(trial, session)
        self.id_path = run_dir.wandb_path(trial, session)
        self._run = None
        self._synced: tuple[int, int] | None = None  # train and eval rows W&B holds; None: not known yet

    def begin(self, frame: int) -> None:
        """The session starts or continues at `frame` (what W&B lacks is asked of W&B instead)."""

    def sync(self, body, clock) -> None:
        """Send W&B the body's rows it lacks."""
        if not self.enabled:
            return
        train_rows, eval_rows = body.train_rows, body.eval_rows
        if self._synced == (len(train_rows), len(eval_rows)):  # nothing new (at the end: a closed run stays closed)
            return
        if self._run is None:
            last = self._start()
            if last is None:  # WANDB_MODE=disabled
                self.enabled = False
                return
            if self._synced is None:
                self._synced = (rows_through(train_rows, last), rows_through(eval_rows, last))
        n_train, n_eval = self._synced
        for point in frame_points(train_rows[n_train:], eval_rows[n_eval:]):
            self._run.log(point.scalars, step=point.frame)
        self._synced = (len(train_rows), len(eval_rows))

    def _start(self) -> int | None:
        """Start or continue the session's W&B run; the last step W&B holds for it (-1: none), or
        None when W&B is disabled."""
        import wandb  # noqa: PLC0415 about 1 s: imported at the first log point, not at start-up
        settings = wandb.setup().settings
        mode, why_offline = wandb_mode(self.options['mode'], settings)
        wandb_dir = self.run_dir.root / 'wandb'
        if why_offline:
            logger.info(f'{self.name}: {why_offline}, so it logs offline to {wandb_dir}; upload later with '
                        f'wandb sync {wandb_dir}')
        if mode == 'disabled':
            logger.info(f'{self.name}: W&B is disabled (WANDB_MODE), nothing is logged to it')
            return None
        record = read_json(self.id_path) if self.id_path.exists() else None
        run_id = record['id'] if isinstance(record, dict) and isinstance(record.get('id'), str) else None
        if run_id is None:
            run_id = secrets.token_hex(4)  # 8 characters of [0-9a-f], as W&B's own ids
            write_json(self.id_path, {'id': run_id})  # before W&B writes anything: a resume finds the id
        options = self.options

        def init(mode: str):
            return wandb.init(
                id=run_id, resume='allow', dir=str(self.run_dir.root), mode=mode, reinit='create_new',
                project=options['project'] or DEFAULT_PROJECT, entity=options['entity'],
                group=options['group'] or self.run_dir.root.name, name=self.name, tags=options['tags'],
                config=self.spec, allow_val_change=True,  # a resume may raise env.max_frame
                settings=wandb.Settings(console='off', silent=True))  # the lab keeps its own log and says where
        try:
            self._run = init(mode)
        except wandb.Error as e:  # no network, a key W&B refuses: training goes on, logged offline
            if mode != 'online':
                raise
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            logger.warning(f'{self.name}: W&B could not start online ({reason}), so it logs offline to {wandb_dir}; '
                           f'upload later with wandb sync {wandb_dir}')
            mode = 'offline'
            wandb.teardown()  # W&B's service still holds the run id it could not start
            self._run = init(mode)
        last = self._run.step - 1  # online: what W&B's server holds; a new or offline run: -1
        if mode == 'offline':
            last = max(last, last_offline_step(wandb_dir, run_id, Path(self._run.dir).parent))
        where = self._run.url if mode == 'online' else self._run.dir
        logger.info(f'{self.name}: W&B run {run_id} ({mode}{", continued" if last >= 0 else ""}): {where}')
        return last

    def close(self) -> None:
        """Finish the W&B run (again is harmless)."""
        if self._run is not None:
            run, self._run = self._run, None
            run.finish()
