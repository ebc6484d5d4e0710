"""The notebook app: `Workbench()` in a JupyterLab cell. Only this package imports the UI libraries."""

from workbench.ui.app import Workbench
from workbench.ui.bokeh_view import load_bokehjs

__all__ = ["Workbench", "load_bokehjs"]
