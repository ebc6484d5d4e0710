"""The Timeline tab: memory through one step (baseline and candidate side by side), the profiled
window's Gantt, and the A/B diff of what changed, op by op.

A thin view: the memory timeline and the Gantt are the profile's own plain data
(`measure.memory_timeline`, `measure.step_timeline`, already downsampled), the diff is
`analysis.trace_diff`. The charts are a `BokehView`.
"""

from __future__ import annotations

import html
import zlib
from typing import Any

import ipywidgets as widgets
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure

from workbench.analysis.trace_diff import TraceDiffError, diff_trials
from workbench.measure.memory_timeline import CATEGORIES
from workbench.measure.result import TrialResult
from workbench.ui.bokeh_view import BokehView

_MIB = float(2**20)
_CATEGORY_COLORS = ("#2e7d32", "#c9a227", "#1f4e9c", "#c62828", "#8e6cc0", "#9e9e9e")
_LANE_PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")
_PHASE_COLORS = {"data": "#8c8c8c", "forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}
SIDES = ("baseline", "candidate")


class TimelineView(BokehView):
    """`TimelineView().widget` is the tab; `show(baseline, candidate)` fills it from two profiled results."""

    def __init__(self) -> None:
        self.header = widgets.HTML(
            "<i>Run a baseline and a candidate with profiling to see where their steps differ.</i>"
        )
        self.diff_table = widgets.HTML()
        self.memory: dict[str, ColumnDataSource] = {}
        self.phases: dict[str, ColumnDataSource] = {}
        self.peaks: dict[str, ColumnDataSource] = {}
        self._memory_figs: dict[str, Any] = {}
        for side in SIDES:
            self.memory[side] = ColumnDataSource({"t_ms": [], **{c: [] for c in CATEGORIES}}, name=f"memory_{side}")
            self.phases[side] = ColumnDataSource({"x": [], "y0": [], "y1": [], "phase": []}, name=f"phases_{side}")
            self.peaks[side] = ColumnDataSource({"t_ms": [], "mib": [], "text": []}, name=f"peak_{side}")
            self._memory_figs[side] = self._memory_figure(side)
        self.gantt = ColumnDataSource({n: [] for n in ("lane", "left", "right", "name", "step", "color")}, name="gantt")
        self._gantt_fig = self._gantt_figure()
        self._data: dict[str, Any] = {}
        self.diff: Any = None
        self.shown: tuple[str | None, ...] = ()
        """Trial ids of the (baseline, candidate) last drawn: the app draws a pair once."""
        chart = self.bokeh_model(column(row(*self._memory_figs.values()), self._gantt_fig))
        self.widget = widgets.VBox([self.header, chart, self.diff_table])

    # --- filling -----------------------------------------------------------------------

    def show(self, baseline: TrialResult | None, candidate: TrialResult | None) -> None:
        """Draw both sides' memory timelines, the candidate's (else the baseline's) Gantt, and their diff."""
        trials = {"baseline": baseline, "candidate": candidate}
        self._data = {side: timeline_data(trial) for side, trial in trials.items()}
        shown = candidate if candidate is not None and candidate.profile else baseline
        self._data["gantt"] = gantt_data(shown)
        self.header.value = _header_html(trials, shown)
        self.diff, self.diff_table.value = None, ""
        if baseline is not None and candidate is not None:
            try:
                self.diff = diff_trials(baseline, candidate, top=12)
                self.diff_table.value = diff_html(self.diff)
            except TraceDiffError as exc:
                self.diff_table.value = f"<span style='color:#666'>No diff: {html.escape(str(exc))}</span>"
        self.resend()

    def resend(self) -> None:
        """Whole-source replacement from the last `show` (also on a browser view's DocumentReady)."""
        for side in SIDES:
            data = self._data.get(side) or timeline_data(None)
            self.memory[side].data, self.phases[side].data, self.peaks[side].data = (
                data["memory"], data["phases"], data["peak"])  # fmt: skip
            self._memory_figs[side].title.text = data["title"]
        gantt = self._data.get("gantt") or gantt_data(None)
        self._gantt_fig.y_range.factors = gantt["lanes"]
        self.gantt.data = gantt["bars"]

    # --- figures -----------------------------------------------------------------------

    def _memory_figure(self, side: str) -> Any:
        fig = figure(title=f"{side}: memory through one step", height=300, width=560, x_axis_label="ms into the step",
                     y_axis_label="MiB allocated", toolbar_location=None)  # fmt: skip
        fig.varea_stack(stackers=list(CATEGORIES), x="t_ms", color=list(_CATEGORY_COLORS), source=self.memory[side],
                        legend_label=[c.replace("_", " ") for c in CATEGORIES])  # fmt: skip
        fig.segment(x0="x", y0="y0", x1="x", y1="y1", source=self.phases[side], color="#333", line_dash="dashed")
        fig.text(x="x", y="y1", text="phase", source=self.phases[side], text_font_size="9pt", x_offset=2)
        fig.scatter(x="t_ms", y="mib", source=self.peaks[side], size=9, color="black", marker="triangle")
        fig.text(x="t_ms", y="mib", text="text", source=self.peaks[side], text_font_size="9pt", y_offset=-4,
                 text_align="center", text_baseline="bottom")  # fmt: skip
        fig.legend.label_text_font_size, fig.legend.spacing = "8pt", 0
        fig.add_layout(fig.legend[0], "right")  # beside the plot: inside, it hides the step's first milliseconds
        return fig

    def _gantt_figure(self) -> Any:
        fig = figure(title="profiled window: phases and longest ops per step", height=260, width=1120,
                     y_range=FactorRange(), x_axis_label="ms (profiled: inflated by the profiler)",
                     toolbar_location="right", tools="xpan,xwheel_zoom,reset")  # fmt: skip
        fig.hbar(y="lane", left="left", right="right", height=0.8, color="color", source=self.gantt, line_color=None)
        fig.add_tools(HoverTool(tooltips=[("", "@name"), ("step", "@step"), ("from", "@left{0.0} ms"),
                                          ("to", "@right{0.0} ms")]))  # fmt: skip
        return fig


# --- plain data for the figures (testable without a browser) ---------------------------------


def timeline_data(trial: TrialResult | None) -> dict[str, Any]:
    """A trial's memory timeline as the figure's columns (MiB), phase boundaries and the peak marker."""
    empty = {
        "memory": {"t_ms": [], **{c: [] for c in CATEGORIES}},
        "phases": {"x": [], "y0": [], "y1": [], "phase": []},
        "peak": {"t_ms": [], "mib": [], "text": []},
        "title": "no memory timeline (run with profiling)",
    }
    timeline = ((trial.profile or {}) if trial is not None else {}).get("memory_timeline") or {}
    if not timeline.get("t_ms"):
        if timeline.get("error"):
            empty["title"] = "memory timeline: " + str(timeline["error"])[:80]
        return empty
    top = max(timeline["total_bytes"]) / _MIB
    phases = timeline.get("phases") or []
    peak = timeline.get("peak") or {}
    where = peak.get("op") or peak.get("module") or ""
    assert trial is not None
    return {
        "memory": {
            "t_ms": list(timeline["t_ms"]),
            **{c: [b / _MIB for b in timeline["categories"][c]] for c in CATEGORIES},
        },
        "phases": {
            "x": [p["start_ms"] for p in phases],
            "y0": [0.0] * len(phases),
            "y1": [top * 1.08] * len(phases),
            "phase": [p["phase"] for p in phases],
        },
        "peak": {
            "t_ms": [peak.get("t_ms", 0.0)],
            "mib": [peak.get("total_bytes", 0) / _MIB],
            "text": [f"peak {peak.get('total_bytes', 0) / _MIB:.1f} MiB {where}".strip()],
        },
        "title": f"{_config_label(trial)}: memory through one step" + _recompute_note(timeline),
    }


def gantt_data(trial: TrialResult | None) -> dict[str, Any]:
    """The step timeline's bars as the Gantt's columns, one color per op name (phases by phase)."""
    timeline = ((trial.profile or {}) if trial is not None else {}).get("step_timeline") or {}
    bars = timeline.get("bars") or []
    return {
        "lanes": list(reversed(timeline.get("lanes") or [])),  # phases on top
        "bars": {
            "lane": [b["lane"] for b in bars],
            "left": [b["start_ms"] for b in bars],
            "right": [b["end_ms"] for b in bars],
            "name": [b["name"] for b in bars],
            "step": [b["step"] for b in bars],
            "color": [_color(b) for b in bars],
        },
    }


def diff_html(diff: Any, limit: int = 12) -> str:
    heads = ("op", "baseline ms", "candidate ms", "delta ms", "share", "calls", "change")
    head = "".join(f"<th style='text-align:left;padding:0 8px'>{h}</th>" for h in heads)
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:0 8px'>{html.escape(str(cell))}</td>" for cell in (
            r.name, f"{r.baseline_ms:.2f}", f"{r.candidate_ms:.2f}", f"{r.delta_ms:+.2f}",
            f"{r.share:.0%}" if r.share is not None else "-", f"{r.baseline_calls:g} → {r.candidate_calls:g}",
            r.change)) + "</tr>"
        for r in diff.rows[:limit]
    )  # fmt: skip
    measured = f"{diff.measured_delta_ms:+.1f} ms" if diff.measured_delta_ms is not None else "n/a"
    explained = f"; the rows explain {diff.explained_share:.0%} of it" if diff.explained_share is not None else ""
    explained += _launches_note(diff.launches)
    return (f"<b>What changed</b> (per profiled step; measured step-time change {measured}{explained})"
            f"<table class='workbench-diff'>{head}{body}</table>")  # fmt: skip


def _launches_note(launches: dict[str, Any]) -> str:
    """'; launches per step 166 → 137': a compiled candidate's fewer, fused kernels in one number."""
    base, cand = launches.get("baseline_launches_per_step"), launches.get("candidate_launches_per_step")
    return f"; launches per step {base:g} → {cand:g}" if base is not None and cand is not None else ""


def _recompute_note(timeline: dict[str, Any]) -> str:
    count = sum((timeline.get("recomputed_ops") or {}).values())
    return f" ({count} forward ops recomputed in backward)" if count else ""


def _color(bar: dict[str, Any]) -> str:
    if bar["lane"] == "phases":
        return _PHASE_COLORS.get(bar["name"], "#999")
    return _LANE_PALETTE[zlib.crc32(bar["name"].encode()) % len(_LANE_PALETTE)]


def _config_label(trial: TrialResult) -> str:
    from workbench.config import TrainConfig

    try:
        return TrainConfig.from_dict(trial.config).describe()
    except Exception:  # a stored config from another version: the id still names it
        return trial.trial_id


def _header_html(trials: dict[str, TrialResult | None], shown: TrialResult | None) -> str:
    parts = []
    for side, trial in trials.items():
        if trial is None:
            parts.append(f"{side}: none")
        else:
            profiled = "profiled" if trial.profile else "not profiled"
            parts.append(
                f"{side}: <b>{html.escape(_config_label(trial))}</b> ({html.escape(trial.trial_id)}, {profiled})"
            )
    trace = ((shown.profile or {}) if shown is not None else {}).get("trace_path")
    trace_html = f"<br>full trace (Perfetto/HTA): <code>{html.escape(trace)}</code>" if trace else ""
    return " — ".join(parts) + trace_html
