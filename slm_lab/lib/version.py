"""Where the running lab's code comes from: its version (slm_lab.__version__, read by
pyproject.toml) and its git commit, looked up once per process. The lab's modules import the
version from here, not from the package, whose lazy `run` leads back into them."""
from __future__ import annotations

import functools
import os
import subprocess

__version__ = '0.1.0'


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The lab's git commit, when it runs from a git checkout."""
    try:
        out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=os.path.dirname(os.path.abspath(__file__)),
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
