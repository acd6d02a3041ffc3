"""Body: the training-metrics record of one session — episode returns, training losses, and the
rows of the train and eval records (the session dataframes)."""
from __future__ import annotations

import math
from collections import deque

import numpy as np

COLUMNS = ('epi', 't', 'wall_t', 'opt_step', 'frame', 'fps', 'total_reward', 'total_reward_ma', 'loss', 'lr',
           'explore_var', 'entropy_coef', 'entropy', 'grad_norm')
MA_WINDOW = 100  # episodes in total_reward_ma


def _mean(values: list) -> float:
    return float(np.mean(values)) if values else math.nan


class Body:
    """Tracks finished episodes' returns and the training metrics between two log points, and
    keeps the train and eval rows.

    total_reward: return of the latest finished episode (mean of the eval episodes in eval rows)
    total_reward_ma: mean return of the last MA_WINDOW finished episodes
    loss, entropy, grad_norm: means over the updates since the previous row
    """

    def __init__(self):
        self.recent_returns: deque = deque(maxlen=MA_WINDOW)
        self.last_return = math.nan
        self.eval_returns: deque = deque(maxlen=MA_WINDOW)
        self._since_row: dict[str, list] = {'loss': [], 'entropy': [], 'grad_norm': []}
        self.train_rows: list[dict] = []
        self.eval_rows: list[dict] = []
        self.best_total_reward_ma = -math.inf
        self._last_row_frame = 0
        self._last_row_wall_t = 0.0

    def track_episodes(self, returns: np.ndarray) -> None:
        """Record the returns of episodes that just finished."""
        if len(returns):
            self.recent_returns.extend(float(r) for r in returns)
            self.last_return = float(returns[-1])

    def track_update(self, metrics: dict | None) -> None:
        """Record one training update's metrics."""
        if metrics:
            for key, values in self._since_row.items():
                if key in metrics:
                    values.append(metrics[key])

    @property
    def total_reward_ma(self) -> float:
        return _mean(self.recent_returns)

    def current_row(self, clock, algorithm) -> dict:
        """A row at the current clock, without consuming the metrics gathered since the last row."""
        wall_t = clock.wall_t
        elapsed = wall_t - self._last_row_wall_t
        fps = (clock.frame - self._last_row_frame) / elapsed if elapsed > 0 else math.nan
        schedules = algorithm.schedule_values()
        return {
            'epi': clock.epi, 't': clock.t, 'wall_t': round(wall_t, 3), 'opt_step': clock.opt_step,
            'frame': clock.frame, 'fps': round(fps, 1), 'total_reward': self.last_return,
            'total_reward_ma': self.total_reward_ma,
            'loss': _mean(self._since_row['loss']), 'lr': algorithm.current_lr(),
            'explore_var': schedules['explore_var'], 'entropy_coef': schedules['entropy_coef'],
            'entropy': _mean(self._since_row['entropy']), 'grad_norm': _mean(self._since_row['grad_norm']),
        }

    def train_row(self, clock, algorithm) -> dict:
        """Make and keep a train row at the current clock; starts a new metrics window."""
        row = self.current_row(clock, algorithm)
        self._last_row_frame, self._last_row_wall_t = clock.frame, clock.wall_t
        for values in self._since_row.values():
            values.clear()
        self.train_rows.append(row)
        return row

    def eval_row(self, train_row: dict, eval_returns: list[float] | None) -> dict:
        """Make and keep an eval row: from greedy eval episodes when given, else the train row."""
        row = dict(train_row)
        if eval_returns is not None:
            self.eval_returns.extend(eval_returns)
            row['total_reward'] = _mean(eval_returns)
            row['total_reward_ma'] = _mean(self.eval_returns)
        self.eval_rows.append(row)
        return row

    def state_dict(self) -> dict:
        return {
            'recent_returns': list(self.recent_returns), 'last_return': self.last_return,
            'eval_returns': list(self.eval_returns),
            'since_row': {k: list(v) for k, v in self._since_row.items()},
            'train_rows': [dict(r) for r in self.train_rows], 'eval_rows': [dict(r) for r in self.eval_rows],
            'best_total_reward_ma': self.best_total_reward_ma,
            'last_row_frame': self._last_row_frame, 'last_row_wall_t': self._last_row_wall_t,
        }

    def load_state_dict(self, state: dict) -> None:
        self.recent_returns = deque(state['recent_returns'], maxlen=MA_WINDOW)
        self.last_return = state['last_return']
        self.eval_returns = deque(state['eval_returns'], maxlen=MA_WINDOW)
        self._since_row = {k: list(v) for k, v in state['since_row'].items()}
        self.train_rows = [dict(r) for r in state['train_rows']]
        self.eval_rows = [dict(r) for r in state['eval_rows']]
        self.best_total_reward_ma = state['best_total_reward_ma']
        self._last_row_frame, self._last_row_wall_t = state['last_row_frame'], state['last_row_wall_t']
