"""A place in a tab that shows one analytical view (a HoloViews object), drawn afresh each time.

The app's History and Tune tabs hold views over stored data, not live streams: a new view is rendered
to Bokeh and shown as a new jupyter_bokeh widget, whose first state carries the whole document, so
nothing is sent before the browser's view of it exists (the race the live charts guard against
with `BokehView`). The HoloViews object stays on `view` for tests and for a user's own cell.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets
from jupyter_bokeh import BokehModel

from workbench.ui.views import ViewError, render


class ViewPane:
    """`ViewPane(name).widget` is the place; `show(view)` draws a view there, `say(text)` a line instead."""

    def __init__(self, name: str) -> None:
        self.name = name
        """The rendered root's Bokeh name (what a browser test looks the document up by)."""
        self.view: Any = None
        self.model: Any = None
        self.widget = widgets.VBox([], layout=widgets.Layout(width="100%"))

    def show(self, view: Any) -> None:
        try:
            model = render(view)
        except (ViewError, ValueError, TypeError) as exc:  # a view that cannot be drawn is a line, not a crash
            self.say(f"this view cannot be drawn: {exc}")
            return
        model.name = self.name
        self.view, self.model = view, model
        self.widget.children = [BokehModel(model)]

    def say(self, text: str) -> None:
        self.view = self.model = None
        self.widget.children = [widgets.HTML(f"<span style='color:#555'>{html.escape(text)}</span>")]

    def clear(self) -> None:
        self.view = self.model = None
        self.widget.children = []
