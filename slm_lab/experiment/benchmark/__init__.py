"""benchmark mode: a suite file's rows (spec, frame budget, seeds, score, published references),
each row x seed run as a trial of the lab's own on Ray Tune (the engine of search mode, so a
benchmark runs on a Ray cluster too and continues after any stop with benchmark@), then a report
with intervals, verdicts, curves and an rliable-style aggregate.

suite.py (the suite file, checked), run.py (the benchmark directory, its trials on Ray),
scores.py (a seed's score per definition), stats.py (intervals, verdicts, IQM), report.py."""
from slm_lab.experiment.benchmark.suite import SCORES, Suite, SuiteError, read_suite, select  # noqa: F401
