"""How the app's parts are arranged, and the small widgets made per workload and per trial.

Kept apart from `app.py` so the app reads as behaviour; this file is only placement, and imports
no app: the app hands its parts to `build_layout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from workbench.ui.runs import TrialRecord
from workbench.workloads import DEFAULT_WORKLOAD, Workload, builtin_workloads


def workload_options(workload: Workload | str | None) -> tuple[list[tuple[str, Any]], bool]:
    """Dropdown options (label, value): the caller's workload first, then the built-ins.

    Returns whether the preset is fixed (a Workload object was built with its own).
    """
    builtins = builtin_workloads()
    names = sorted(builtins)
    if workload is None:
        names.remove(DEFAULT_WORKLOAD)
        return [(_builtin_label(DEFAULT_WORKLOAD, builtins), DEFAULT_WORKLOAD)] + [
            (_builtin_label(n, builtins), n) for n in names
        ], False
    if isinstance(workload, Workload):
        return [(f"{workload.describe()} (yours)", workload)] + [
            (_builtin_label(n, builtins), n) for n in names
        ], workload.source is None
    if workload in builtins:
        names.remove(workload)
        return [(_builtin_label(workload, builtins), workload)] + [
            (_builtin_label(n, builtins), n) for n in names
        ], False
    return [(f"{workload} (yours)", workload)] + [(_builtin_label(n, builtins), n) for n in names], False


def _builtin_label(name: str, builtins: dict[str, Any]) -> str:
    description = builtins[name].description
    return f"{name} — {description}" if description else name


def progress_row(record: TrialRecord) -> tuple[widgets.IntProgress, widgets.HTML]:
    bar = widgets.IntProgress(value=0, min=0, max=record.total_steps, layout=widgets.Layout(width="220px"))
    bar.style.bar_color = record.entry.color
    caption = widgets.HTML(f"<b>{record.entry.label}</b> #{record.repeat}: queued")
    return bar, caption


def build_layout(
    *,
    header: widgets.Widget,
    workload: Sequence[widgets.Widget],
    config: widgets.Widget,
    window: Sequence[widgets.Widget],
    buttons: Sequence[widgets.Widget],
    live: Sequence[widgets.Widget],
    results: Sequence[widgets.Widget],
    export: widgets.Widget,
    tabs: Mapping[str, widgets.Widget],
) -> widgets.VBox:
    """The app's page, top to bottom: what to run, how, the buttons, live progress and charts, the
    comparison, the export, then the tabs. The parts are handed in, so this module knows no app."""
    return widgets.VBox(
        [
            header,
            widgets.HBox(list(workload)),
            widgets.Accordion(
                children=[config], titles=("Configuration (generated from TrainConfig)",), selected_index=0
            ),
            widgets.HBox(list(window)),
            widgets.HBox(list(buttons)),
            *live,
            widgets.HTML("<b>Comparison against the baseline</b>"),
            *results,
            widgets.Accordion(children=[export], titles=("Export the selected run",), selected_index=0),
            widgets.Tab(children=list(tabs.values()), titles=tuple(tabs)),
        ],
        layout=widgets.Layout(width="100%"),
    )
