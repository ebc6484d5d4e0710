"""How the app's parts are arranged, and the small widgets made per workload and per trial.

Kept apart from `app.py` so the app reads as behaviour; this file is only placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from workbench.workloads import Workload, builtin_workloads

if TYPE_CHECKING:
    from workbench.ui.app import Workbench
    from workbench.ui.runs import TrialRecord

DEFAULT_WORKLOAD = "bev-perception"


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


def build_layout(app: Workbench) -> widgets.VBox:
    workload_row = widgets.HBox([app.workload_picker, app.preset_picker])
    app.workload_picker.layout = widgets.Layout(width="520px")
    config = widgets.Accordion(
        children=[app.panel.widget], titles=("Configuration (generated from TrainConfig)",), selected_index=0
    )
    window = widgets.HBox([app.warmup, app.steps, app.precision, app.budget, app.profile_box])
    buttons = widgets.HBox([app.run_baseline_button, app.run_candidate_button, app.cancel_button])
    export = widgets.Accordion(children=[app.export.widget], titles=("Export the selected run",), selected_index=0)
    return widgets.VBox(
        [
            app.header,
            workload_row,
            config,
            window,
            buttons,
            app.status,
            app.progress,
            app.charts.widget,
            widgets.HTML("<b>Comparison against the baseline</b>"),
            app.table,
            app.ranks,
            export,
            widgets.Tab(
                children=[app.diagnosis.widget, app.history.widget, app.tune.widget, app.timeline.widget],
                titles=("Diagnosis of the latest run", "History", "Tune", "Timeline"),
            ),
        ],
        layout=widgets.Layout(width="100%"),
    )
