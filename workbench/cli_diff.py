"""Deprecated path: the diff command is `workbench.cli.diff`."""

from workbench.cli.diff import DiffInputError, resolve_trial
from workbench.moved import warn_moved

__all__ = ["DiffInputError", "resolve_trial"]
warn_moved(__name__, "workbench.cli.diff")
