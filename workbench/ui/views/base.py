"""What the analytical views share: HoloViews with its Bokeh backend, colours, and the "not measured" panel.

HoloViews is imported here and nowhere else, so a missing package is one clear error with the
fix; the views return HoloViews objects, which a notebook shows, `hv.render` turns into Bokeh
(the app's tabs) and the report writes into one standalone file.
"""

from __future__ import annotations

import html
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from workbench.store import Store, StoreError, default_store_path

try:
    import holoviews
except ImportError:  # optional at the edge: the engine runs without the UI packages
    holoviews = None

NUMERICS_COLORS = {"ok": "#1f77b4", "mismatch": "#d62728", "not checked": "#7f7f7f"}
FRONT_COLOR, WINNER_COLOR, FLAG_COLOR = "#2ca02c", "#ff7f0e", "#d62728"
WIDTH, HEIGHT = 720, 300


class ViewError(ValueError):
    """A view was given data it cannot draw; the message says what it accepts."""


def hv() -> Any:
    """The holoviews module with its Bokeh plotting backend loaded (the options below are Bokeh's)."""
    if holoviews is None:
        raise ViewError("the analytical views need HoloViews: pip install holoviews")
    importlib.import_module("holoviews.plotting.bokeh")  # registers the Bokeh backend and its options
    if holoviews.Store.current_backend != "bokeh":
        holoviews.Store.set_current_backend("bokeh")
    return holoviews


def not_measured(title: str, why: str) -> Any:
    """A panel that says what was not measured and how to measure it: never an empty or zero chart."""
    text = f"<b>{html.escape(title)}</b>: not measured — {html.escape(why)}"
    return hv().Div(f"<div class='workbench-not-measured'>{text}</div>").opts(width=WIDTH, height=60)


def render(view: Any) -> Any:
    """The Bokeh model of a view (for the app's tabs and the report)."""
    return hv().render(view, backend="bokeh")


@contextmanager
def opened_store(store: Store | str | os.PathLike[str] | None) -> Iterator[Store]:
    """`store` as given (left open), or the file at a path (or the default history), closed after."""
    if isinstance(store, Store):
        yield store
        return
    path = store if store is not None else default_store_path()
    if path is None:
        raise ViewError("the run history is off (WORKBENCH_STORE=off): pass store= the file to read")
    try:
        opened = Store(path, create=False)
    except StoreError as exc:
        raise ViewError(str(exc)) from None
    with opened:
        yield opened
