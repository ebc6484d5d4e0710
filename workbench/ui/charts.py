"""Live charts: step time per step, peak memory per trial, device utilization and memory over time.

A `BokehView`: the Python-side ColumnDataSources are the authority, every update replaces a
source's whole (small) data, unchanged data is not sent again, and a new browser view gets the
full state: a trial started in the same cell as `display` still fills the chart.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataRange1d, HoverTool
from bokeh.models.annotations import LabelSet
from bokeh.plotting import figure

from workbench.measure.monitor import Sample
from workbench.ui.bokeh_view import BokehView

#: Seconds of device history the utilization/memory timelines show.
TIMELINE_S = 60.0
_GIB = float(2**30)
_MIB = float(2**20)
GPU_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass(frozen=True)
class TrialSeries:
    """What the step-time and memory charts need of one trial (built by the app, not computed here)."""

    key: int
    label: str
    color: str
    step_ms: Sequence[float]
    peak_memory_bytes: int | None
    timed_windows: Sequence[Sequence[float]] = ()
    """Each finished trial's timed window, [start, end] in `time.time()` seconds (the monitor's clock)."""


class LiveCharts(BokehView):
    """Owns the Bokeh document and its sources; `set_trials`/`set_device` are called from the app's pump."""

    def __init__(self, gpu_names: Sequence[str] = ()) -> None:
        self.gpu_names = list(gpu_names)
        self._lock = threading.RLock()
        self._last: dict[str, dict[str, list[Any]]] = {}

        self.step_points = ColumnDataSource(_empty("step", "step_ms", "trial", "color"), name="step_time_points")
        self.step_lines = ColumnDataSource(_empty("xs", "ys", "label", "color"), name="step_time_lines")
        self.peak_memory = ColumnDataSource(_empty("pos", "peak_mib", "label", "color", "text"), name="peak_memory")
        util_cols = [f"gpu{i}" for i in range(len(self.gpu_names))] or ["cpu"]
        self.utilization = ColumnDataSource(_empty("t", *util_cols), name="utilization")
        mem_cols = [f"gpu{i}" for i in range(len(self.gpu_names))] or ["rss"]
        self.device_memory = ColumnDataSource(_empty("t", *mem_cols), name="device_memory")
        self.trial_windows = ColumnDataSource(_empty("x0", "x1", "label", "color"), name="trial_windows")

        self.widget = self.bokeh_model(self._layout(util_cols, mem_cols))

    # --- updates (any thread) ------------------------------------------------------

    def set_trials(self, trials: Sequence[TrialSeries]) -> None:
        """Step times of every trial (timed steps only: warm-up and compile would hide the scale)."""
        points: dict[str, list[Any]] = _empty("step", "step_ms", "trial", "color")
        lines: dict[str, list[Any]] = _empty("xs", "ys", "label", "color")
        bars: dict[str, list[Any]] = _empty("pos", "peak_mib", "label", "color", "text")
        for trial in trials:
            steps = list(range(1, len(trial.step_ms) + 1))
            points["step"] += steps
            points["step_ms"] += [float(x) for x in trial.step_ms]
            points["trial"] += [trial.label] * len(steps)
            points["color"] += [trial.color] * len(steps)
            if steps:
                lines["xs"].append(steps)
                lines["ys"].append([float(x) for x in trial.step_ms])
                lines["label"].append(trial.label)
                lines["color"].append(trial.color)
            if trial.peak_memory_bytes is not None:
                bars["pos"].append(len(bars["pos"]))
                bars["peak_mib"].append(trial.peak_memory_bytes / _MIB)
                bars["label"].append(trial.label)
                bars["color"].append(trial.color)
                bars["text"].append(f"{trial.label}: {trial.peak_memory_bytes / _MIB:,.0f} MiB")
        with self._lock:
            self._replace(self.step_points, points)
            self._replace(self.step_lines, lines)
            self._replace(self.peak_memory, bars)
            self._replace(self.trial_windows, window_spans(trials))

    def set_device(self, samples: Sequence[Sample]) -> None:
        """The monitor's history: per-GPU utilization and memory, or host CPU and process-tree RSS."""
        util: dict[str, list[Any]] = {"t": [s["t"] * 1000.0 for s in samples]}
        mem: dict[str, list[Any]] = {"t": list(util["t"])}
        if self.gpu_names:
            for i in range(len(self.gpu_names)):
                util[f"gpu{i}"] = [_gpu(s, i, "util_pct") for s in samples]
                used = [_gpu(s, i, "mem_used_bytes") for s in samples]
                mem[f"gpu{i}"] = [None if u is None else u / _GIB for u in used]
        else:
            util["cpu"] = [s["host"]["cpu_pct"] for s in samples]
            mem["rss"] = [_tree_rss(s) / _GIB for s in samples]
        with self._lock:
            self._replace(self.utilization, util)
            self._replace(self.device_memory, mem)

    def resend(self) -> None:
        """Push every source's full data again (a new view appeared, or a caller asks)."""
        with self._lock:
            for source in self.sources():
                data = self._last.get(source.name or "")
                if data is not None:
                    source.data = {k: list(v) for k, v in data.items()}

    def sources(self) -> list[ColumnDataSource]:
        return [self.step_points, self.step_lines, self.peak_memory, self.utilization, self.device_memory,
                self.trial_windows]  # fmt: skip

    # --- internals -----------------------------------------------------------------

    def _replace(self, source: ColumnDataSource, data: dict[str, list[Any]]) -> None:
        name = source.name or ""
        if self._last.get(name) == data:
            return  # unchanged: send nothing
        self._last[name] = data
        source.data = data

    def _layout(self, util_cols: list[str], mem_cols: list[str]) -> Any:
        steps = figure(
            title="Step time per timed step (baseline and candidates)",
            height=280,
            sizing_mode="stretch_width",
            x_axis_label="timed step",
            y_axis_label="ms",
            tools="pan,box_zoom,wheel_zoom,reset,save",
            name="step_time",
        )
        steps.multi_line(
            xs="xs", ys="ys", line_color="color", line_width=2, legend_field="label", source=self.step_lines
        )
        dots = steps.scatter(x="step", y="step_ms", color="color", size=5, source=self.step_points)
        steps.add_tools(
            HoverTool(renderers=[dots], tooltips=[("trial", "@trial"), ("step", "@step"), ("ms", "@step_ms{0.0}")])
        )
        steps.legend.location = "top_right"
        steps.legend.click_policy = "hide"

        peaks = figure(
            title="Peak memory per trial (MiB)",
            height=220,
            sizing_mode="stretch_width",
            tools="",
            toolbar_location=None,
        )
        peaks.hbar(y="pos", right="peak_mib", height=0.7, color="color", alpha=0.6, source=self.peak_memory)
        peaks.text(
            x=0, y="pos", text="text", text_baseline="middle", text_font_size="9pt", x_offset=4, source=self.peak_memory
        )
        peaks.yaxis.visible = False
        peaks.x_range = DataRange1d(start=0)

        gpu = bool(self.gpu_names)
        util = _timeline(
            "GPU utilization (%) — NVML" if gpu else "Host CPU utilization (%) — psutil", "%", self.utilization
        )
        mem = _timeline(
            "GPU memory used (GiB) — NVML" if gpu else "Process-tree RSS (GiB) — psutil", "GiB", self.device_memory
        )
        labels = [f"GPU {i}: {n}" for i, n in enumerate(self.gpu_names)] or ["CPU, mean of cores"]
        _lines(util, util_cols, labels, self.utilization)
        _lines(mem, mem_cols, labels if gpu else ["kernel + trial workers"], self.device_memory)
        for fig in (util, mem):
            shade_windows(fig, self.trial_windows)
            fig.legend.location = "top_left"
        util.y_range = DataRange1d(start=0, end=100)
        return column(steps, row(peaks, util, mem, sizing_mode="stretch_width"), sizing_mode="stretch_width")


def window_spans(trials: Sequence[TrialSeries]) -> dict[str, list[Any]]:
    """One span per finished trial's timed window, in the timelines' x unit (ms since the epoch)."""
    spans: dict[str, list[Any]] = _empty("x0", "x1", "label", "color")
    for trial in trials:
        for start, end in trial.timed_windows:
            spans["x0"].append(start * 1000.0)
            spans["x1"].append(end * 1000.0)
            spans["label"].append(trial.label.split(":")[0])
            spans["color"].append(trial.color)
    return spans


def shade_windows(fig: Any, source: ColumnDataSource) -> None:
    """Shade each trial's timed window in its colour and name it at the top, so the baseline's and a
    candidate's utilization sit side by side on one time axis."""
    fig.vstrip(x0="x0", x1="x1", fill_color="color", fill_alpha=0.12, line_color="color", line_alpha=0.5,
               source=source, name="timed_windows")  # fmt: skip
    fig.add_layout(LabelSet(x="x0", y=4, y_units="screen", text="label", text_font_size="8pt", text_color="color",
                            x_offset=2, source=source))  # fmt: skip


def _timeline(title: str, unit: str, source: ColumnDataSource) -> Any:
    fig = figure(
        title=title,
        height=220,
        sizing_mode="stretch_width",
        x_axis_type="datetime",
        y_axis_label=unit,
        tools="",
        toolbar_location=None,
    )
    fig.x_range = DataRange1d(follow="end", follow_interval=TIMELINE_S * 1000.0, range_padding=0)
    return fig


def _empty(*columns: str) -> dict[str, list[Any]]:
    return {c: [] for c in columns}


def _gpu(sample: Sample, index: int, key: str) -> Any:
    gpus = sample["gpus"]
    return gpus[index].get(key) if index < len(gpus) else None


def _tree_rss(sample: Sample) -> float:
    host = sample["host"]
    return float((host["rss_bytes"] or 0) + (host["children_rss_bytes"] or 0))


def _lines(fig: Any, columns: list[str], labels: list[str], source: ColumnDataSource) -> None:
    """One line per column (per GPU, or the host's one), coloured and labelled alike across charts."""
    for i, col in enumerate(columns):
        fig.line(
            x="t", y=col, color=GPU_COLORS[i % len(GPU_COLORS)], line_width=2, legend_label=labels[i], source=source
        )
