"""Deprecated path: the diagnose and estimate commands are `workbench.cli.diagnose`; `parse_bytes` is
`workbench.textfmt.parse_bytes`."""

from workbench.moved import warn_moved
from workbench.textfmt import parse_bytes

__all__ = ["parse_bytes"]
warn_moved(__name__, "workbench.cli.diagnose (parse_bytes: workbench.textfmt)")
