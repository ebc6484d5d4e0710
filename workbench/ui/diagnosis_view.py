"""The Diagnosis tab: findings with their evidence, an Apply button per recommendation, a compiled
trial's Compile section, memory and top operators.

A thin view: findings come from `analysis.diagnose.diagnose_trial`, the CLI's own entry point
(FLOPs counted, so MFU shows here as it does there), memory rows from
`analysis.memory_breakdown`, operators from the trial's profile; this widget only draws
them. "Apply" turns a recommendation into a candidate config (checked against the device
the trial ran on) and hands it to `on_apply`, which the app uses to run the candidate.
The memory charts are a `BokehView`.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure

from workbench.analysis.advice import Recommendation
from workbench.analysis.diagnose import Diagnosis, diagnose_trial
from workbench.analysis.memory_breakdown import MemoryRow, category_rows, module_rows
from workbench.config import ConfigError, TrainConfig
from workbench.measure.result import TrialResult
from workbench.ui.bokeh_view import BokehView
from workbench.ui.compile_section import compile_section_html
from workbench.workloads import Workload

_MIB = float(2**20)
_SEVERITY_COLOR = {"bottleneck": "#b3261e", "info": "#1f6feb"}
_COLUMNS = ("label", "mib", "share")


class DiagnosisView(BokehView):
    """`DiagnosisView(on_apply=...).widget` is the tab; `show(result, diagnosis)` fills it.

    `on_apply(candidate_config)` is called by each recommendation's Apply button (and by
    `apply(rec)`, which tests and the app call directly). `device` is where candidates must
    run; None means the device the shown trial ran on.
    """

    def __init__(self, *, on_apply: Callable[[TrainConfig], None] | None = None, device: str | None = None) -> None:
        self.on_apply = on_apply
        self.device = device
        self.result: TrialResult | None = None
        self.diagnosis: Diagnosis | None = None
        self.buttons: list[tuple[widgets.Button, Recommendation]] = []
        self.applied: list[TrainConfig] = []

        self.header = widgets.HTML("<i>Run a trial with profiling to see why its step is slow.</i>")
        self.findings = widgets.VBox()
        self.compile = widgets.HTML()
        self.operators = widgets.HTML()
        self.message = widgets.HTML()
        self.categories = ColumnDataSource({name: [] for name in _COLUMNS}, name="memory_categories")
        self.modules = ColumnDataSource({name: [] for name in _COLUMNS}, name="memory_modules")
        self._category_fig = _bars("Memory at peak, by category", self.categories, "#4c72b0")
        self._module_fig = _bars("Activations held, by module", self.modules, "#dd8452")
        self._memory_data: tuple[list[MemoryRow], list[MemoryRow]] = ([], [])
        chart = self.bokeh_model(row(self._category_fig, self._module_fig))
        self.widget = widgets.VBox([self.header, self.findings, self.compile, chart, self.operators, self.message])

    # --- filling -----------------------------------------------------------------------

    def show(
        self,
        result: TrialResult,
        diagnosis: Diagnosis | None = None,
        workload: Workload | str | None = None,
        baseline: TrialResult | None = None,
    ) -> None:
        """Show one trial's diagnosis: `diagnosis` if given, else `diagnose_trial`'s (FLOPs counted from
        `workload`, or from the result's own workload source; a compiled trial's compile time judged
        against an uncompiled `baseline`). The trial shown already is not diagnosed again."""
        if diagnosis is None and result is self.result:
            return
        self.result = result
        self.diagnosis = diagnosis if diagnosis is not None else diagnose_trial(result, workload, baseline=baseline)
        self.message.value = ""
        self.header.value = self._header_html(result, self.diagnosis)
        self.buttons = []
        self.findings.children = [self._finding_box(index, f) for index, f in enumerate(self.diagnosis.findings)]
        self.compile.value = compile_section_html(result)
        self._memory_data = (category_rows(result.memory_breakdown), module_rows(result.memory_modules))
        self.resend()
        self.operators.value = _operators_html((result.profile or {}).get("top_ops") or [])

    def apply(self, recommendation: Recommendation) -> TrainConfig | None:
        """The candidate config for `recommendation`, handed to `on_apply`; None (and a message) if it cannot run."""
        if self.result is None:
            return None
        try:
            base = TrainConfig.from_dict(self.result.config)
            candidate = recommendation.apply(base, device=self.device or _trial_device(self.result))
        except ConfigError as exc:
            self._say(str(exc), error=True)
            return None
        self.applied.append(candidate)
        if self.on_apply is not None:
            self.on_apply(candidate)
        self._say(f"candidate: {html.escape(candidate.describe())}")
        return candidate

    # --- drawing -----------------------------------------------------------------------

    def _finding_box(self, index: int, finding: Any) -> widgets.VBox:
        color = _SEVERITY_COLOR.get(finding.severity, "#444")
        title = widgets.HTML(
            f"<b style='color:{color}'>{html.escape(finding.title)}</b> "
            f"<span style='color:#666'>({finding.severity})</span><br>{html.escape(finding.summary)}"
        )
        rows: list[widgets.Widget] = [title]
        for rec in finding.recommendations:
            text = widgets.HTML(
                f"{rec.rank}. <b>{html.escape(rec.title)}</b> — {html.escape(rec.expected)}"
                f"<br><span style='color:#666'>why: {html.escape(rec.why)}</span>"
            )
            if rec.actionable:
                change = ", ".join(f"{k}={v}" for k, v in rec.changes.items())
                button = widgets.Button(description="Apply", tooltip=change, button_style="success")
                button.on_click(lambda _button, rec=rec: self.apply(rec))
                self.buttons.append((button, rec))
                rows.append(widgets.HBox([button, text]))
            else:
                rows.append(text)
        return widgets.VBox(rows, layout=widgets.Layout(border="1px solid #ddd", padding="4px", margin="4px 0"))

    def _header_html(self, result: TrialResult, diagnosis: Diagnosis) -> str:
        primary = diagnosis.primary
        verdict = f"primary: <b>{html.escape(primary.title)}</b>" if primary else "no bottleneck found"
        mfu = diagnosis.mfu
        mfu_text = f"MFU {mfu.mfu:.1%}" if mfu is not None and mfu.mfu is not None else ""
        notes = "".join(f"<br><span style='color:#666'>{html.escape(n)}</span>" for n in diagnosis.notes)
        trace = (result.profile or {}).get("trace_path")
        trace_html = f"<br>trace: <code>{html.escape(trace)}</code>" if trace else ""
        return f"<b>{html.escape(result.workload)}</b> ({html.escape(result.trial_id)}): {verdict} {mfu_text}{notes}{trace_html}"

    def resend(self) -> None:
        """Whole-source replacement (and the categorical axes' factors) from the last shown trial."""
        for source, fig, rows in ((self.categories, self._category_fig, self._memory_data[0]),
                                  (self.modules, self._module_fig, self._memory_data[1])):  # fmt: skip
            labels = [r.label for r in rows][::-1]  # largest on top
            fig.y_range.factors = labels
            source.data = {"label": labels, "mib": [r.bytes / _MIB for r in rows][::-1],
                           "share": [f"{r.share:.0%}" for r in rows][::-1]}  # fmt: skip

    def _say(self, text: str, error: bool = False) -> None:
        color = "#b3261e" if error else "#1a7f37"
        self.message.value = f"<span style='color:{color}'>{text}</span>"


def _bars(title: str, source: ColumnDataSource, color: str) -> Any:
    fig = figure(title=title, y_range=FactorRange(), height=260, width=420, x_axis_label="MiB", toolbar_location=None)
    fig.hbar(y="label", right="mib", height=0.7, source=source, color=color)
    fig.add_tools(HoverTool(tooltips=[("", "@label"), ("MiB", "@mib{0.0}"), ("share", "@share")]))
    return fig


def _operators_html(rows: list[dict[str, Any]], limit: int = 12) -> str:
    if not rows:
        return ""
    head = "".join(f"<th style='text-align:left;padding:0 8px'>{h}</th>" for h in
                   ("operator", "calls/step", "self ms/step", "share", "input shapes"))  # fmt: skip
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:0 8px'>{html.escape(str(cell))}</td>" for cell in (
            r["name"], f"{r['calls_per_step']:g}", f"{r['self_ms_per_step']:.2f}", f"{r.get('self_share', 0):.0%}",
            r["input_shapes"])) + "</tr>"
        for r in rows[:limit]
    )  # fmt: skip
    return f"<b>Top operators</b> (profiled window)<table>{head}{body}</table>"


def _trial_device(result: TrialResult) -> str:
    return "cuda" if result.device.get("type") == "cuda" else "cpu"
