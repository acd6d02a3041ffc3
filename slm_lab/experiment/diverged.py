"""A training that diverged: the values that became NaN or infinite, and the one-line error that
says where the run can continue from."""
from __future__ import annotations

import math

import numpy as np

from slm_lab.lib.errors import TrainingDiverged
from slm_lab.persistence.run_dir import RunDir


def finite_in_float32(x) -> bool:
    """Whether every number of `x` is finite once in float32 (1e300 is not: it becomes inf)."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        return True
    with np.errstate(over='ignore'):
        return bool(np.isfinite(x.astype(np.float32)).all())


def nonfinite_cause(nonfinite_nets: list[str], inputs: tuple, error: Exception) -> str | None:
    """Why torch refused to act or train (`error`), when non-finite values caused it: a net's
    weights (`nonfinite_nets`), or the observations or rewards (`inputs`, in that order), hold
    NaN or infinity (e.g. a Categorical's logits become NaN after a NaN update, or a huge
    env.reward_scale makes the returns infinite). None otherwise: the error is a bug."""
    bad_inputs = [name for name, x in zip(('observations', 'rewards'), inputs) if not finite_in_float32(x)]
    if not (nonfinite_nets or bad_inputs):
        return None
    what = f'non-finite weights in net(s) {", ".join(nonfinite_nets)}' if nonfinite_nets else \
        f'non-finite {" and ".join(bad_inputs)} from the env (as float32, which training uses)'
    return f'{what} (torch refused them with a {type(error).__name__})'


def nonfinite_metrics(metrics: dict, inputs: tuple = ()) -> str:
    """The loss and gradient norm of an update that are NaN or infinite, as 'loss nan, ...', and
    the observations or rewards (`inputs`, in that order) that were already so, if any."""
    what = ', '.join(f'{k} {metrics[k]}' for k in ('loss', 'grad_norm') if k in metrics
                     and not math.isfinite(metrics[k]))
    bad_inputs = [name for name, x in zip(('observations', 'rewards'), inputs) if not finite_in_float32(x)]
    if bad_inputs:
        what += f', from non-finite {" and ".join(bad_inputs)} of the env (as float32, which training uses)'
    return what


def diverged_error(prename: str, run_dir: RunDir, frame: int, opt_step: int, last_snapshot_frame: int | None,
                   what: str) -> TrainingDiverged:
    """The one-line error for a value met in training that became NaN or infinite (`what`), with
    the snapshot a changed spec can continue from."""
    if last_snapshot_frame is None:
        fix = ('no snapshot was saved before it; start a new run with a changed spec (e.g. a lower '
               'agent.net.optim_spec.lr or a clip_grad_val)')
    else:
        fix = (f'the snapshot at frame {last_snapshot_frame} is intact: continue from it with a changed spec, '
               f'e.g. python run_lab.py SPEC_FILE {run_dir.spec_name} train@{run_dir.root} '
               '-s agent.net.optim_spec.lr=<lower> --force')
    return TrainingDiverged(f'{prename}: training diverged at frame {frame} (opt_step {opt_step}): {what}; this step '
                            f'was not saved; {fix}')
