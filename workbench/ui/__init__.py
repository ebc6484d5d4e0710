"""The notebook app and views: `Workbench()` in a JupyterLab cell, `Watch("job")` for a watched job
live, and the analytical views over stored data (`history`, `pareto`, `op_diff`, `ranks`,
`data_pipeline`: HoloViews objects a cell shows, the app's tabs hold and `wb.report` writes).

Only this package imports the UI libraries. Names resolve on first use, so drawing one view does
not import the app's widgets (and the app does not import HoloViews until a view is drawn).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.ui.app import Workbench
    from workbench.ui.bokeh_view import load_bokehjs
    from workbench.ui.report import write_report
    from workbench.ui.views.base import ViewError
    from workbench.ui.views.data_pipeline import data_pipeline
    from workbench.ui.views.history import history
    from workbench.ui.views.op_diff import op_diff
    from workbench.ui.views.pareto import pareto
    from workbench.ui.views.ranks import ranks
    from workbench.ui.watch_view import Watch

#: public name -> "module:attribute" it is defined in.
_PUBLIC = {
    "Workbench": "workbench.ui.app:Workbench",
    "Watch": "workbench.ui.watch_view:Watch",
    "load_bokehjs": "workbench.ui.bokeh_view:load_bokehjs",
    "history": "workbench.ui.views:history",
    "pareto": "workbench.ui.views:pareto",
    "op_diff": "workbench.ui.views:op_diff",
    "ranks": "workbench.ui.views:ranks",
    "data_pipeline": "workbench.ui.views:data_pipeline",
    "ViewError": "workbench.ui.views:ViewError",
    "write_report": "workbench.ui.report:write_report",
}

__all__ = [
    "ViewError",
    "Watch",
    "Workbench",
    "data_pipeline",
    "history",
    "load_bokehjs",
    "op_diff",
    "pareto",
    "ranks",
    "write_report",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    target = _PUBLIC.get(name)
    if target is None:
        raise AttributeError(f"module 'workbench.ui' has no attribute {name!r}; public names: {', '.join(__all__)}")
    module_name, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
