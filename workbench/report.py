"""Deprecated path: the terminal's text helpers moved to `workbench.terminal`.

Kept for one release. Importing it warns; its names are `workbench.terminal`'s. Importing it also
binds `workbench.report` to this module over the public function `wb.report`, so the module calls
that function (`workbench.ui.write_report`, reached by name: the UI sits above this layer).
"""

from __future__ import annotations

import importlib
from typing import Any

from workbench import terminal
from workbench.callable_module import make_callable
from workbench.moved import warn_moved

warn_moved("workbench.report", "workbench.terminal")


def __getattr__(name: str) -> Any:
    """`from workbench.report import run_summary` and the like: the name from `workbench.terminal`."""
    try:
        return getattr(terminal, name)
    except AttributeError:
        raise AttributeError(f"module 'workbench.report' has no attribute '{name}'") from None


def _write_report(*args: Any, **kwargs: Any) -> Any:
    return importlib.import_module("workbench.ui").write_report(*args, **kwargs)


make_callable(__name__, _write_report)
