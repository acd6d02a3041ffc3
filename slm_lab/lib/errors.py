"""Errors a user can cause. run_lab.py prints their message as one line and exits non-zero."""


class LabError(Exception):
    """Base of every user-caused error: the message names the cause and the fix."""

    exit_code = 2


class SpecError(LabError):
    """The spec file, spec name or spec content is invalid."""


class ModeError(LabError):
    """The lab mode on the command line is unknown or not available yet."""


class ResumeError(LabError):
    """A run cannot be resumed as asked."""
