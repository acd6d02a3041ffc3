"""Measure how long the lab takes to write its HTML graphs, and how much disk they take.

    python bench/graphs.py             # 500 and 5,000 rows, 5 repetitions (~2 s)
    python bench/graphs.py --reps 20 --rows 500 20000

A session writes its HTML graph at log points during training (at most once a minute) and at
the end; a trial writes its graph once. For each row count, a session dataframe with that many
rows (the columns the lab plots: frame, total_reward, total_reward_ma, loss) is plotted with
`viz.plot_session`, and four such sessions with `viz.plot_trial`, HTML only (no PNG, which needs
a headless browser and takes about 2 s). One untimed write first warms up plotly's imports and
writes the graph directory's shared plotly.min.js, as a session's first graph does; each figure
is then the best and the median of --reps writes into that directory.

Sizes: one session graph's HTML, the shared plotly.min.js, and what the graph/ directory of a
run with 64 sessions (64 session graphs and one trial graph) holds, against the same graphs
each embedding plotly.js (what the lab wrote before graphs shared one copy).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slm_lab.experiment import viz  # noqa: E402

MB = 1e6


def session_df(rows: int, seed: int) -> pd.DataFrame:
    """A plausible session record: noisy rising returns, their moving average, a loss."""
    rng = np.random.default_rng(seed)
    total_reward = np.cumsum(rng.normal(1.0, 3.0, rows))
    return pd.DataFrame({'frame': np.arange(rows) * 100, 'total_reward': total_reward,
                         'total_reward_ma': pd.Series(total_reward).rolling(100, min_periods=1).mean(),
                         'loss': rng.random(rows)})


def time_writes(write, reps: int) -> tuple[float, float]:
    """(best, median) seconds of `reps` calls of write()."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        write()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', type=int, nargs='+', default=[500, 5000], help='rows per session dataframe')
    parser.add_argument('--reps', type=int, default=5, help='timed writes per figure (default 5)')
    args = parser.parse_args()
    viz.png_available = lambda: False  # HTML only: the PNG path is a separate, optional cost

    with tempfile.TemporaryDirectory() as tmp:
        graph_dir = Path(tmp) / 'graph'
        print(f'{"graph":<28} {"rows":>7} {"best":>9} {"median":>9}')
        for rows in args.rows:
            df = session_df(rows, seed=0)
            sessions = [session_df(rows, seed=s) for s in range(4)]
            viz.plot_session(df, 'warm-up', str(graph_dir / 'warm_t0_s0'))
            for what, write in (
                    ('session (plot_session)', lambda: viz.plot_session(df, 'bench', str(graph_dir / 'bench_t0_s0'))),
                    ('trial of 4 (plot_trial)',
                     lambda: viz.plot_trial(sessions, 'bench', str(graph_dir / 'bench_t0')))):
                best, median = time_writes(write, args.reps)
                print(f'{what:<28} {rows:>7} {best * 1000:>7.0f} ms {median * 1000:>6.0f} ms')

        html = os.path.getsize(graph_dir / 'bench_t0_s0_session_graph.html')
        bundle = os.path.getsize(graph_dir / viz.PLOTLY_JS)
        run_64 = 65 * html + bundle
        embedded_64 = 65 * (html + bundle)
        print(f'\nsession graph HTML ({args.rows[-1]} rows): {html / MB:.2f} MB; shared {viz.PLOTLY_JS}: '
              f'{bundle / MB:.2f} MB')
        print(f'graph/ of a 64-session run: {run_64 / MB:.0f} MB with one shared copy, '
              f'{embedded_64 / MB:.0f} MB with plotly.js embedded in each graph')


if __name__ == '__main__':
    main()
