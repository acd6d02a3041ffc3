"""Logging: one logger for the lab, printing to the console and to the session's log file."""
from __future__ import annotations

import functools
import logging
import sys

LOG_FORMAT = '[%(asctime)s %(levelname)s %(name)s] %(message)s'
_root = logging.getLogger('slm_lab')
FILE_ONLY = {'console': False}  # logger.info(..., extra=FILE_ONLY): in the session's log file, not on the console


def get_logger(name: str) -> logging.Logger:
    """A child logger of the lab's logger."""
    return logging.getLogger(name if name.startswith('slm_lab') else f'slm_lab.{name}')


def setup_console(level: int = logging.INFO) -> None:
    """Log the lab's messages to stderr at `level` (idempotent)."""
    _root.setLevel(level)
    _root.propagate = False
    for h in list(_root.handlers):
        if getattr(h, '_lab_console', False):
            _root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, '%Y-%m-%d %H:%M:%S'))
    handler.addFilter(lambda record: getattr(record, 'console', True))  # FILE_ONLY records: the log file's
    handler._lab_console = True
    _root.addHandler(handler)


def add_file_handler(path: str, level: int = logging.DEBUG) -> logging.Handler:
    """Also write everything logged to `path` (the session's log file). Returns the handler."""
    handler = logging.FileHandler(path, encoding='utf-8')
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, '%Y-%m-%d %H:%M:%S'))
    _root.addHandler(handler)
    return handler


def remove_handler(handler: logging.Handler) -> None:
    """Detach and close a handler added by add_file_handler."""
    _root.removeHandler(handler)
    handler.close()


@functools.lru_cache(maxsize=None)
def warn_once(name: str, message: str) -> None:
    """Log `message` as a warning on logger `name` once per process (a spec is validated more than
    once per run; its warnings are said once). Tests clear it with warn_once.cache_clear()."""
    get_logger(name).warning(message)
