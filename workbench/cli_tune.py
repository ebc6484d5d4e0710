"""Deprecated path: the tune command is `workbench.cli.tune`; `parse_duration` is `workbench.textfmt.parse_duration`."""

from workbench.cli.tune import summary
from workbench.moved import warn_moved
from workbench.textfmt import parse_duration

__all__ = ["parse_duration", "summary"]
warn_moved(__name__, "workbench.cli.tune (parse_duration: workbench.textfmt)")
