"""The analytical views over stored data, as HoloViews objects: show one in a notebook cell, put it in
the app's tabs (`render`), or write it into the standalone report (`wb.report`)."""

from workbench.ui.views.base import ViewError, render
from workbench.ui.views.data_pipeline import data_pipeline
from workbench.ui.views.history import history
from workbench.ui.views.op_diff import op_diff
from workbench.ui.views.pareto import pareto
from workbench.ui.views.ranks import ranks

__all__ = ["ViewError", "data_pipeline", "history", "op_diff", "pareto", "ranks", "render"]
