"""SLM Lab: a spec-driven deep reinforcement learning lab.

From Python: `slm_lab.run(spec, spec_name=None, mode='train', overrides=None)` (slm_lab/api.py,
docs/python-api.md). Importing this package loads nothing heavy: torch and the envs load at the
first run."""

from slm_lab.lib.version import __version__  # noqa: F401 (the package's version)


def run(spec, spec_name=None, mode='train', overrides=None, data_dir='data', **options):
    """Run a spec (a file path or a spec dict) in a mode; returns RunResult(run_dir, metrics).
    The full description: slm_lab.api.run."""
    from slm_lab import api  # noqa: PLC0415 kept out of `import slm_lab`, which must stay cheap
    return api.run(spec, spec_name, mode, overrides, data_dir, **options)


def benchmark(suite_file, mode='benchmark', rows=None, seeds=None, data_dir='data', **options):
    """Run (or continue) a benchmark of a suite file; returns BenchmarkResult(run_dir, report, files).
    The full description: slm_lab.api.benchmark."""
    from slm_lab import api  # noqa: PLC0415 kept out of `import slm_lab`, which must stay cheap
    return api.benchmark(suite_file, mode, rows, seeds, data_dir, **options)


def publish(benchmarks, to, data_dir='data'):
    """Publish benchmark directories' finished row-seeds into a folder of small files; returns
    PublishResult(report, files, left_out). The full description: slm_lab.api.publish."""
    from slm_lab import api  # noqa: PLC0415 kept out of `import slm_lab`, which must stay cheap
    return api.publish(benchmarks, to, data_dir)
