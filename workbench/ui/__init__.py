"""The notebook app: `Workbench()` in a JupyterLab cell, and `Watch("job")`, a watched job live.

Only this package imports the UI libraries."""

from workbench.ui.app import Workbench
from workbench.ui.bokeh_view import load_bokehjs
from workbench.ui.watch_view import Watch

__all__ = ["Watch", "Workbench", "load_bokehjs"]
