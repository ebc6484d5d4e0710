"""The notebook app: `Workbench()` in a JupyterLab cell. Only this package imports the UI libraries."""

from workbench.ui.app import Workbench, load_bokehjs

__all__ = ["Workbench", "load_bokehjs"]
