"""`wb.ui.Watch("bev-r50")`: a watched job live in a notebook, from wherever it runs.

It reads what the job's writer thread commits to the run history (the same transport as the
JupyterLab panel: nothing connects the job to the kernel, so a closed notebook costs the job
nothing), once a second on its own thread: the newest launch of that name, every rank of it
under torchrun. Charts: step time per step with the data wait stacked under it, and peak memory
per step, one colour per rank; a table per rank with the state, the steady figures and the
window's utilization.
"""

from __future__ import annotations

import html
import os
import threading
from pathlib import Path
from typing import Any

import ipywidgets as widgets
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.store.watch_profiles import watch_profiles
from workbench.store.watched import WatchedRun, watch_steps, watched_runs
from workbench.textfmt import format_bytes, format_ms
from workbench.ui.bokeh_view import BokehView, load_bokehjs
from workbench.ui.charts import GPU_COLORS
from workbench.watch.job import job_of
from workbench.watch.requests import profile_job

_MIB = float(2**20)
#: Steps the view's button asks the job to profile.
PROFILE_STEPS = 5


class Watch(BokehView):
    """A watched job's live view: `Watch("bev-r50")` in a cell (the newest launch with that name, or
    the launch a job id from `workbench job --json` names)."""

    def __init__(self, name: str, *, store: StoreArg = DEFAULT_STORE, interval_s: float = 1.0,
                 start: bool = True) -> None:  # fmt: skip
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name the watched job to show, as passed to wb.watch(name=...); got {name!r}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        self.name, self.interval_s, self._store = name.strip(), float(interval_s), store
        self.runs: list[WatchedRun] = []
        self.error = ""
        self._lock = threading.RLock()
        self._last: dict[str, dict[str, list[Any]]] = {}
        self._closed = threading.Event()
        self.steps = ColumnDataSource(_empty("xs", "ys", "label", "color"), name="watch_step_ms")
        self.waits = ColumnDataSource(_empty("xs", "ys", "label", "color"), name="watch_data_ms")
        self.memory = ColumnDataSource(_empty("xs", "ys", "label", "color"), name="watch_memory")
        self.table = widgets.HTML()
        self.profile_button = widgets.Button(description=f"Profile next {PROFILE_STEPS} steps",
                                             tooltip="the job profiles its next steps and diagnoses them; it never stops")  # fmt: skip
        self.profile_button.on_click(lambda _: self.request_profile())
        self.profile_note = widgets.HTML()
        self.windows = widgets.HTML()
        self.widget = widgets.VBox([self.table, widgets.HBox([self.profile_button, self.profile_note]), self.windows,
                                    self.bokeh_model(self._layout())])  # fmt: skip
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._poll, name="workbench-watch-view", daemon=True)
            self._thread.start()

    def refresh(self) -> None:
        """Read the store now and update the table and charts (the polling thread calls this)."""
        if isinstance(self._store, (str, os.PathLike)) and not Path(self._store).exists():
            self.error = f"waiting for '{self.name}' to write its first step (no history file at {self._store} yet)"
            with self._lock:
                self.table.value = self._table_html([], {})
            return
        try:
            with opened_store(self._store, create=False) as store:
                if store is None:
                    raise LookupError("the run history is off (WORKBENCH_STORE=off); pass store= the job's file")
                found = watched_runs(store, name=self.name, limit=64) or watched_runs(store, job=self.name, limit=64)
                runs = _newest_launch(found)
                rows = {r.run_id: watch_steps(store, r.run_id, recent=True) for r in runs}
                windows = [(r, w) for r in runs for w in watch_profiles(store, r.run_id)]
            self.error = "" if runs else f"no watched job named '{self.name}' yet: it shows once it has written a step"
        except Exception as exc:  # a missing or locked store: said in the view, tried again next tick
            runs, rows, windows, self.error = [], {}, [], f"cannot read the run history: {exc}"
        with self._lock:
            self.runs = runs
            self._set_charts(runs, rows)
            self.table.value = self._table_html(runs, rows)
            self.windows.value = _windows_html(windows)

    def request_profile(self, steps: int = 0) -> None:
        """Ask the running job (every rank of it) for a profiled window; the result shows below when done."""
        try:
            ids = profile_job(self.name, steps or PROFILE_STEPS, self._store)
            self.profile_note.value = html.escape(f"asked ({len(ids)} run(s)): the job takes it at its next flush")
        except (LookupError, ValueError, OSError) as exc:  # said in the view, never raised into the notebook
            self.profile_note.value = html.escape(str(exc))

    def close(self) -> None:
        self._closed.set()
        self.widget.close()

    def resend(self) -> None:
        with self._lock:
            for source in (self.steps, self.waits, self.memory):
                data = self._last.get(source.name or "")
                if data is not None:
                    source.data = {k: list(v) for k, v in data.items()}

    def _ipython_display_(self) -> None:
        from IPython.display import display

        load_bokehjs()
        display(self.widget)

    # --- internals -----------------------------------------------------------------

    def _poll(self) -> None:
        while not self._closed.is_set():
            self.refresh()
            self._closed.wait(self.interval_s)

    def _set_charts(self, runs: list[WatchedRun], rows: dict[int, list[Any]]) -> None:
        steps, waits, memory = (_empty("xs", "ys", "label", "color") for _ in range(3))
        for i, run in enumerate(runs):
            label, color = _label(run), GPU_COLORS[i % len(GPU_COLORS)]
            timed = [r for r in rows[run.run_id] if r.step_ms is not None]
            xs = [r.first_step for r in timed]
            _append(steps, xs, [r.step_ms for r in timed], label, color)
            waited = [(r.first_step, r.data_ms) for r in timed if r.data_ms is not None]
            if waited:  # the data wait as an area under the step line: the part of each step spent waiting
                wx = [x for x, _ in waited]
                _append(waits, [wx[0], *wx, wx[-1]], [0.0, *(w for _, w in waited), 0.0], f"{label} data wait", color)
            mem = [(r.first_step, r.peak_memory_bytes / _MIB) for r in timed if r.peak_memory_bytes is not None]
            if mem:
                _append(memory, [x for x, _ in mem], [m for _, m in mem], label, color)
        for source, data in ((self.steps, steps), (self.waits, waits), (self.memory, memory)):
            if self._last.get(source.name or "") != data:
                self._last[source.name or ""] = data
                source.data = data

    def _table_html(self, runs: list[WatchedRun], rows: dict[int, list[Any]]) -> str:
        if self.error:
            return f"<p><b>{html.escape(self.name)}</b>: {html.escape(self.error)}</p>"
        head = "<tr><th>run</th><th>state</th><th>step</th><th>steady step</th><th>data wait</th>" \
               "<th>peak memory</th><th>CPU</th><th>GPU</th></tr>"  # fmt: skip
        body = "".join(_row(run) for run in runs)
        return f"<p><b>{html.escape(self.name)}</b>{_ranks_line(runs, rows)}</p><table class='workbench-watch'>{head}{body}</table>"

    def _layout(self) -> Any:
        step = figure(title="Step time (ms), data wait shaded under it", height=260, sizing_mode="stretch_width",
                      x_axis_label="step", y_axis_label="ms", tools="pan,box_zoom,wheel_zoom,reset,save")  # fmt: skip
        step.patches(xs="xs", ys="ys", fill_color="color", fill_alpha=0.25, line_alpha=0, source=self.waits)
        lines = step.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, legend_field="label",
                                source=self.steps)  # fmt: skip
        step.add_tools(HoverTool(renderers=[lines], tooltips=[("run", "@label"), ("ms", "$y{0.0}")]))
        mem = figure(title="Peak memory per step (MiB)", height=200, sizing_mode="stretch_width",
                     x_axis_label="step", tools="", toolbar_location=None)  # fmt: skip
        mem.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, source=self.memory)
        return column(step, mem, sizing_mode="stretch_width")


def _windows_html(windows: list[tuple[WatchedRun, Any]]) -> str:
    """Each profiled window: its steps, and the diagnosis's primary finding with its first fix."""
    lines = []
    for run, window in windows:
        where = f"{_label(run)}, steps {window.first_step}-{window.last_step}" if window.first_step else _label(run)
        if window.status != "done":
            lines.append(f"{where}: profile {window.status}" + (f" ({window.message})" if window.message else ""))
            continue
        findings = (window.diagnosis or {}).get("findings") or []
        if not findings:
            lines.append(f"{where}: profiled; no bottleneck found")
            continue
        top = findings[0]
        fix = (top.get("recommendations") or [{}])[0].get("title", "")
        lines.append(f"{where}: <b>{html.escape(top['title'])}</b> — {html.escape(top['summary'])}"
                     + (f"; try: {html.escape(fix)}" if fix else ""))  # fmt: skip
    return "<br>".join(lines)


def _newest_launch(runs: list[WatchedRun]) -> list[WatchedRun]:
    """The newest run, or every rank of the newest launch when it is a torchrun job (by rank)."""
    if not runs:
        return []
    newest = runs[0]
    if newest.job is None:
        return [newest]
    return sorted((r for r in runs if r.job == newest.job), key=lambda r: r.rank or 0)


def _ranks_line(runs: list[WatchedRun], rows: dict[int, list[Any]]) -> str:
    """For a torchrun job: its state (the rank that failed first, and how), then the straggler with its
    cause, a busy host, or why no rank is named."""
    if not runs or runs[0].job is None:
        return ""
    job = job_of(runs, rows)
    state = f" — {html.escape(job.status)}"
    if job.failure:
        state = f" — <b>failed: {html.escape(job.failure.splitlines()[0])}</b>"
    pace = html.escape(job.pace())
    if job.straggler is not None:
        head, _, rest = pace.partition(" — ")
        return f"{state} — <b>{head}</b> — {rest}"
    return f"{state} — {pace}"


def _label(run: WatchedRun) -> str:
    return f"rank {run.rank}" if run.rank is not None else f"run {run.run_id}"


def _row(run: WatchedRun) -> str:
    s, window = run.summary, run.summary.get("window") or {}
    state = "; ".join(m for m in (run.message, run.nonfinite_loss, run.compiled) if m)
    cells = [_label(run), run.status + (f": {state}" if state else ""), str(run.last_step),
             _ms(s.get("steady_median_ms")), _ms(s.get("steady_data_ms")), format_bytes(s.get("peak_memory_bytes")),
             _pct(window.get("cpu_pct")), _pct(window.get("gpu_util_pct"))]  # fmt: skip
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{format_ms(value)} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _append(data: dict[str, list[Any]], xs: list[Any], ys: list[Any], label: str, color: str) -> None:
    if xs:
        data["xs"].append(xs)
        data["ys"].append(ys)
        data["label"].append(label)
        data["color"].append(color)


def _empty(*columns: str) -> dict[str, list[Any]]:
    return {c: [] for c in columns}
