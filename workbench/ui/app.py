"""`Workbench`: the notebook app — pick a workload, toggle, run, watch live, compare, export.

Three threads, one direction: trials run in worker processes behind `TrialRunner`;
their events land in an inbox; one pump thread drains it a few times a second (4 Hz by
default) and is the only writer of the charts, table, progress bars and export panel.
Button handlers on the kernel thread only enqueue. So a step never waits for the UI,
and the UI never waits for a step.
"""

from __future__ import annotations

import collections
import dataclasses
import html
import threading
import time
from typing import Any

import ipywidgets as widgets

from workbench.analysis.compare import Comparison
from workbench.api import ComparisonRun, Protocol
from workbench.config import ConfigError, TrainConfig
from workbench.device import device_info, resolve_device
from workbench.levers import capabilities, check_config
from workbench.measure import RoundMeasured, StepMeasured, TrialRequest, TrialResult, TrialStarted
from workbench.measure.monitor import DeviceMonitor
from workbench.terminal import verdict_text
from workbench.ui.bokeh_view import load_bokehjs
from workbench.ui.charts import TIMELINE_S, LiveCharts, TrialSeries
from workbench.ui.controls import ConfigPanel
from workbench.ui.diagnosis_view import DiagnosisView
from workbench.ui.exporter import ExportPanel
from workbench.ui.history_view import HistoryView
from workbench.ui.layout import build_layout, progress_row, workload_options
from workbench.ui.runs import Entry, Inbox, RunSpec, TrialRecord, TrialRunner, finish
from workbench.ui.table import comparison_for, render_ranks, render_table
from workbench.ui.timeline_view import TimelineView
from workbench.ui.tune_view import TuneView
from workbench.workloads import PRESETS, Workload

BASELINE_COLOR = "#222222"
CANDIDATE_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
#: Idle pump wake-up period, and how long the monitor keeps sampling after the last trial.
IDLE_PERIOD_S = 1.0
MONITOR_LINGER_S = 5.0
MAX_PROGRESS_ROWS = 8


class Workbench:
    """The app. Evaluate it in a cell to show it; drive it from code through the same widgets."""

    def __init__(
        self,
        workload: Workload | str | None = None,
        *,
        preset: str | None = None,
        device: str | None = None,
        warmup: int = TrialRequest.warmup,
        steps: int = TrialRequest.steps,
        precision: float | None = None,
        budget_s: float | None = None,
        protocol: Protocol | None = None,
        timeout_s: float | None = None,
        refresh_hz: float = 4.0,
        monitor_rate_hz: float = 10.0,
    ) -> None:
        """`protocol` is how each comparison is measured (the default: ±3% within 60 s, 95%, 3 paired
        workers); its precision and budget show as the app's two fields, which `precision` and
        `budget_s` set and which a person may change before each run."""
        self._protocol = protocol or Protocol()
        dev = resolve_device(device)
        self.device = str(dev)
        self.device_info = device_info(dev)
        self.timeout_s = timeout_s
        self.refresh_period = 1.0 / refresh_hz
        self.entries: list[Entry] = []
        self.records: list[TrialRecord] = []
        self._next_key = 1
        self._lock = threading.RLock()
        self._inbox: Inbox = collections.deque()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._last_busy = 0.0

        self.monitor = DeviceMonitor(monitor_rate_hz, history_s=2 * TIMELINE_S)
        self.panel = ConfigPanel(capabilities(dev))
        self.charts = LiveCharts(self.monitor.gpu_names)
        self.export = ExportPanel(self._insert_cell)
        self._frontend = _jupyterlab_frontend()
        self._build_widgets(workload, preset or ("base" if dev.type == "cuda" else "tiny"), warmup, steps)
        self.precision.value = (self._protocol.precision if precision is None else precision) * 100.0
        self.budget.value = self._protocol.budget_s if budget_s is None else budget_s
        self.runner = TrialRunner(self._inbox, self._wake.set)
        self._pump = threading.Thread(target=self._pump_loop, name="workbench-ui-pump", daemon=True)
        self._pump.start()

    # --- display ---------------------------------------------------------------------

    def _ipython_display_(self) -> None:
        from IPython.display import display

        load_bokehjs()
        display(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        load_bokehjs()
        return self.widget._repr_mimebundle_(**kwargs)

    # --- actions (buttons call these; so can code) -----------------------------------

    def run_baseline(self, config: TrainConfig | None = None) -> Entry | None:
        """Run `config` (default: the panel's) as the new baseline (one trial); None if refused."""
        return self._submit("baseline", config)

    def run_candidate(self, config: TrainConfig | None = None) -> Entry | None:
        """Run `config` (default: the panel's) as a candidate: with a baseline, a calibrated comparison
        against it (paired rounds until ±precision or the budget); None if refused."""
        return self._submit("candidate", config)

    @property
    def comparison(self) -> Comparison | None:
        """The baseline and each candidate's protocol verdict, with the winner (what the table shows)."""
        with self._lock:
            return comparison_for(self.entries)

    def use_stored_baseline(self, result: TrialResult) -> Entry:
        """Make a stored trial (History tab) the baseline, without running it again."""
        source = result.workload_source or {}
        workload = source.get("name") or result.workload
        preset = source.get("preset") or result.preset or "tiny"
        request = TrialRequest(workload, warmup=max(1, result.warmup), steps=max(1, result.steps), device=self.device,
                               preset=preset, timeout_s=self.timeout_s)  # fmt: skip
        spec = RunSpec(request, f"{workload} [{preset}]")
        config = TrainConfig.from_dict(result.config)
        with self._lock:
            entry = self._new_entry("baseline", config, spec)
            record = TrialRecord(entry, repeat=1, status=result.status, result=result)
            record.steps_done, record.step_ms = record.total_steps, list(result.step_ms)
            entry.records.append(record)
            self.panel.set_config(config)
            self.warmup.value, self.steps.value = max(1, result.warmup), max(1, result.steps)
            if any(value == workload for _, value in self.workload_picker.options):
                self.workload_picker.value = workload
        self._show_results()
        if result.ok:
            self.diagnosis.show(result, workload=workload)
            self._show_timeline(result)
        self._say(f"Baseline is now stored trial {result.trial_id} ({config.describe()}); run candidates against it.")
        return entry

    def _show_timeline(self, latest: TrialResult) -> None:
        """The Timeline tab: the latest profiled trial against its baseline's profiled trial (if any)."""
        if not latest.profile:
            return
        baselines = [r for e in self.entries if e.role == "baseline" for r in e.results() if r.ok and r.profile]
        baseline = baselines[-1] if baselines else None
        candidate = None if baseline is latest else latest
        shown = tuple(t.trial_id if t is not None else None for t in (baseline, candidate))
        if self.timeline.shown != shown:  # the results table refreshes often: draw each pair once
            self.timeline.shown = shown
            self.timeline.show(baseline, candidate)

    def _eager_baseline(self, latest: TrialResult) -> TrialResult | None:
        """The uncompiled baseline a compiled run's compile time is judged against (None if there is none)."""
        if TrainConfig.from_dict(latest.config).compile == "off":
            return None
        baselines = [r for e in self.entries if e.role == "baseline" for r in e.results() if r.ok]
        eager = [r for r in baselines if TrainConfig.from_dict(r.config).compile == "off"]
        return eager[-1] if eager else None

    def cancel(self) -> None:
        """Stop the running trial (its worker process ends) and drop the queued ones."""
        self.runner.cancel_all()
        self._say("Cancelling…")

    def wait(self, timeout: float | None = None) -> None:
        """Block until every submitted trial finished and the UI shows it (tests, scripts)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.runner.busy or self._inbox:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"trials still running after {timeout} s")
            time.sleep(0.05)
        self._flush()

    def insert_snippet(self) -> None:
        """Call in a cell: the selected export becomes the next cell (works in any Jupyter front end)."""
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise RuntimeError("insert_snippet needs an IPython kernel; use wb.export.snippet.value instead")
        shell.set_next_input(self.export.snippet.value, replace=False)

    def close(self) -> None:
        """Stop the threads, the monitor and any running trial; close the widgets."""
        self._closed.set()
        self._wake.set()
        self.tune.cancel()
        self.runner.close()
        self.monitor.close()
        self.history.close()
        self._pump.join(timeout=2)
        self.widget.close()

    # --- internals: building ---------------------------------------------------------

    def _build_widgets(self, workload: Workload | str | None, preset: str, warmup: int, steps: int) -> None:
        options, fixed = workload_options(workload)
        self.workload_picker = widgets.Dropdown(
            options=options, value=options[0][1], description="workload", layout=widgets.Layout(width="520px")
        )
        self.preset_picker = widgets.ToggleButtons(
            options=list(PRESETS), value=preset, description="preset", disabled=fixed, style={"button_width": "auto"}
        )
        self.warmup = widgets.BoundedIntText(
            value=warmup, min=1, max=10_000, description="warm-up", layout=widgets.Layout(width="160px")
        )
        self.steps = widgets.BoundedIntText(
            value=steps, min=1, max=100_000, description="steps", layout=widgets.Layout(width="160px")
        )
        self.precision = widgets.BoundedFloatText(
            value=3.0, min=0.1, max=50.0, step=0.5, description="± %", layout=widgets.Layout(width="150px"),
            tooltip="stop a comparison when its speedup interval is this narrow",
        )  # fmt: skip
        self.budget = widgets.BoundedIntText(
            value=60, min=5, max=3600, description="budget s", layout=widgets.Layout(width="170px"),
            tooltip="seconds a comparison may take before it stops adding rounds",
        )  # fmt: skip
        self.run_baseline_button = widgets.Button(description="Run baseline", button_style="primary", icon="play")
        self.run_candidate_button = widgets.Button(description="Run candidate", button_style="success", icon="play")
        self.cancel_button = widgets.Button(description="Cancel", button_style="danger", icon="stop", disabled=True)
        self.run_baseline_button.on_click(lambda _: self.run_baseline())
        self.run_candidate_button.on_click(lambda _: self.run_candidate())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.profile_box = widgets.Checkbox(value=False, description="profile a few extra steps (for Diagnosis)")
        self.diagnosis = DiagnosisView(on_apply=lambda config: void(self.run_candidate(config)), device=self.device)
        self.timeline = TimelineView()
        self.history = HistoryView(
            on_pick_baseline=lambda result: void(self.use_stored_baseline(result)),
            on_open_config=self.panel.set_config,
        )
        self.tune = TuneView(self._tune_spec, self._insert_cell)
        self.tune.refresh_space()
        self.workload_picker.observe(lambda _: self.tune.refresh_space(), names="value")
        self.status = widgets.HTML("")
        self.progress = widgets.VBox([])
        self.table = widgets.HTML(render_table([], None))
        self.ranks = widgets.HTML("")
        gpu_ok, gpu_reason = self.monitor.gpu_status()
        info = self.device_info
        self.header = widgets.HTML(
            f"<b>Training Workbench</b> — trials run on <code>{html.escape(self.device)}</code> "
            f"({html.escape(info.name)}, {info.cpu_cores} CPU cores). Device monitor: "
            f"{html.escape(gpu_reason if gpu_ok else 'host CPU and memory via psutil — ' + gpu_reason)}"
        )
        self.widget = build_layout(
            header=self.header,
            workload=[self.workload_picker, self.preset_picker],
            config=self.panel.widget,
            window=[self.warmup, self.steps, self.precision, self.budget, self.profile_box],
            buttons=[self.run_baseline_button, self.run_candidate_button, self.cancel_button],
            live=[self.status, self.progress, self.charts.widget],
            results=[self.table, self.ranks],
            export=self.export.widget,
            tabs={"Diagnosis of the latest run": self.diagnosis.widget, "History": self.history.widget,
                  "Tune": self.tune.widget, "Timeline": self.timeline.widget},
        )  # fmt: skip

    # --- internals: submitting -------------------------------------------------------

    def _spec(self) -> RunSpec:
        workload = self.workload_picker.value
        preset = self.preset_picker.value
        label = workload.describe() if isinstance(workload, Workload) else f"{workload} [{preset}]"
        protocol = dataclasses.replace(
            self._protocol, precision=self.precision.value / 100.0, budget_s=float(self.budget.value)
        )
        request = TrialRequest.of(workload, warmup=self.warmup.value, steps=self.steps.value, device=self.device,
                                  preset=preset, timeout_s=self.timeout_s, profile=self.profile_box.value)  # fmt: skip
        return RunSpec(request, label, protocol=protocol)

    def _tune_spec(self) -> dict[str, Any]:
        """What the Tune tab searches: the workload, preset, device and window chosen above."""
        options = {"timeout_s": self.timeout_s} if self.timeout_s is not None else {}
        return {"workload": self.workload_picker.value, "preset": self.preset_picker.value, "device": self.device,
                "warmup": self.warmup.value, "steps": self.steps.value, "trial_options": options}  # fmt: skip

    def _submit(self, role: str, config: TrainConfig | None = None) -> Entry | None:
        try:
            if config is not None:
                self.panel.set_config(config)  # show what runs; check_config below refuses what cannot
            config = config if config is not None else self.panel.config()
            check_config(config, self.device)
            spec = self._spec()
        except ConfigError as exc:
            self._say(f"Not started: {exc}", error=True)
            return None
        with self._lock:
            baseline = next((e for e in self.entries if e.role == "baseline"), None)
            if role == "candidate" and baseline is not None and not _same_window(baseline.spec, spec):
                self._say(
                    f"Not started: the baseline ran {baseline.spec.workload_label} with {baseline.spec.warmup}+"
                    f"{baseline.spec.steps} steps; run a new baseline for {spec.workload_label} with these settings first",
                    error=True,
                )
                return None
            entry = self._new_entry(role, config, spec)
            if role == "candidate":
                entry.baseline = baseline  # compared by the protocol once the baseline's trial has finished
            self._enqueue(entry)
        against = " against the baseline" if role == "candidate" and baseline is not None else ""
        self._say(f"Queued {entry.label}{against}.")
        return entry

    def _new_entry(self, role: str, config: TrainConfig, spec: RunSpec) -> Entry:
        if role == "baseline":  # a new baseline replaces the old one
            self.entries = [e for e in self.entries if e.role != "baseline"]
            entry = Entry(0, "baseline", config, spec, BASELINE_COLOR)
            self.entries.insert(0, entry)
        else:
            key = self._next_key
            self._next_key += 1
            entry = Entry(key, "candidate", config, spec, CANDIDATE_COLORS[(key - 1) % len(CANDIDATE_COLORS)])
            self.entries.append(entry)
        return entry

    def _enqueue(self, entry: Entry) -> None:
        record = TrialRecord(entry, repeat=len(entry.records) + 1)
        entry.records.append(record)
        self.records.append(record)
        record.bar, record.caption = progress_row(record)
        self.progress.children = [*self.progress.children, widgets.HBox([record.bar, record.caption])][
            -MAX_PROGRESS_ROWS:
        ]
        self.cancel_button.disabled = False
        self.runner.submit(record)
        self._wake.set()

    def _insert_cell(self, text: str) -> str:
        if self._frontend is not None:
            from workbench.ui.exporter import insert_cell_via_jupyterlab

            return insert_cell_via_jupyterlab(text, self._frontend)
        try:
            self.insert_snippet()
        except RuntimeError as exc:
            return str(exc)
        return "This front end cannot add cells from a button: the snippet appears after the next cell you run."

    def _say(self, text: str, error: bool = False) -> None:
        color = "#b00020" if error else "#333"
        self.status.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    # --- internals: the pump ---------------------------------------------------------

    def _pump_loop(self) -> None:
        while not self._closed.is_set():
            busy = self.runner.busy
            self._wake.wait(self.refresh_period if busy or self.monitor.running else IDLE_PERIOD_S)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self._flush()
            except Exception as exc:  # a UI bug must not stop the pump; show it instead
                self._say(f"UI update failed: {type(exc).__name__}: {exc}", error=True)

    def _flush(self) -> None:
        with self._lock:
            steps_changed, finished = self._drain()
            busy = self.runner.busy
            if busy:
                self._last_busy = time.monotonic()
                if not self.monitor.running:
                    self.monitor.start()
            elif self.monitor.running and time.monotonic() - self._last_busy > MONITOR_LINGER_S:
                self.monitor.stop()
            if steps_changed or finished:
                self.charts.set_trials([_series(e) for e in self.entries])
            if self.monitor.running or steps_changed:
                self.charts.set_device(self.monitor.samples(since=time.time() - TIMELINE_S))
            if finished:
                self._show_results()
                self.history.refresh()  # the trial was stored before its result arrived here
            self.cancel_button.disabled = not busy

    def _drain(self) -> tuple[bool, bool]:
        steps_changed = finished = False
        touched: set[int] = set()
        while self._inbox:
            record, item = self._inbox.popleft()
            touched.add(id(record))
            if isinstance(item, StepMeasured):
                record.steps_done = item.step + 1
                record.last_step_ms = item.step_ms
                if item.timed:
                    record.step_ms.append(item.step_ms)
                    steps_changed = True
            elif isinstance(item, RoundMeasured):
                record.step_ms.extend(item.blocks.get(1, []))  # the candidate is config 1 of its comparison
                width = item.half_widths.get(1)
                record.round_text = (
                    f"round {item.round}: ±{width:.1%} (target ±{item.precision:.1%})"
                    if width is not None
                    else f"round {item.round}: too few rounds for an interval yet"
                ) + f", {item.elapsed_s:.0f}/{item.budget_s:.0f} s"
                steps_changed = True
            elif isinstance(item, TrialStarted) or item == "running":
                record.status = "running"
            elif isinstance(item, (TrialResult, ComparisonRun)):
                finish(record, item)
                finished = True
        for record in self.records:
            if id(record) in touched:
                _update_progress(record)
        return steps_changed, finished

    def _show_results(self) -> None:
        comparison = comparison_for(self.entries)
        self.table.value = render_table(self.entries, comparison)
        choices: list[tuple[str, TrainConfig]] = []
        winner: int | None = None
        rows = comparison.candidates if comparison is not None else []
        best = rows[comparison.winner] if comparison is not None and comparison.winner is not None else None
        for entry in self.entries:
            if not any(r.ok for r in entry.results()):
                continue
            label = entry.label
            if entry.row is not None and entry.row.speedup is not None:
                label += f" — {entry.row.speedup:.2f}× ({entry.row.verdict})"
                if entry.row is best:  # the winner rule is the comparison's (`pick_winner`), not the app's
                    winner = len(choices)
            choices.append((label, entry.config))
        if winner is None and comparison is not None:  # nothing won: keep what runs today, not a loser
            winner = 0
        self.export.set_choices(choices, winner)
        done = [r for r in self.records if r.result is not None]
        if done and done[-1].result is not None and done[-1].result.ok:
            latest = done[-1].result
            self.diagnosis.show(latest, workload=done[-1].entry.spec.workload, baseline=self._eager_baseline(latest))
            self.ranks.value = render_ranks(done[-1].result)
            self._show_timeline(done[-1].result)
        if done and not self.runner.busy:
            last = done[-1].result
            assert last is not None
            verdict = f" — {done[-1].entry.row.verdict}" if done[-1].entry.row is not None else ""
            self._say(
                f"Finished {done[-1].entry.label}: {last.status}{verdict}"
                + (f" — {last.message.splitlines()[0]}" if last.message else "")
            )


def void(_: object) -> None:
    """Drop a return value: the views' callbacks return nothing."""


def _same_window(a: RunSpec, b: RunSpec) -> bool:
    return (a.workload_label, a.warmup, a.steps, a.preset) == (b.workload_label, b.warmup, b.steps, b.preset)


def _series(entry: Entry) -> TrialSeries:
    steps = [ms for record in entry.records for ms in record.step_ms]
    peaks = [r.peak_memory_bytes for r in entry.results() if r.peak_memory_bytes is not None]
    windows = [r.timed_window for r in entry.results() if r.timed_window]
    return TrialSeries(entry.key, entry.label, entry.color, steps, max(peaks) if peaks else None, windows)


def _update_progress(record: TrialRecord) -> None:
    bar, caption = record.bar, record.caption
    bar.value = record.steps_done
    spec = record.entry.spec
    if record.result is not None:
        result = record.result
        row = record.entry.row
        bar.bar_style = "success" if result.ok else "danger"
        median = f"median {result.median_step_ms:.1f} ms" if result.median_step_ms else ""
        why = result.message.splitlines()[0][:160] if result.message else ""
        verdict = f"{verdict_text(row)} after {row.units} rounds" if row is not None else ""
        text = f"{result.status} {median} {verdict} {why}".strip()
    elif record.round_text:
        text = record.round_text
    elif record.steps_done <= spec.warmup:
        text = f"warm-up {record.steps_done}/{spec.warmup}" + (
            f" ({record.last_step_ms:.0f} ms)" if record.last_step_ms else ""
        )
    else:
        text = f"step {record.steps_done - spec.warmup}/{spec.steps}, {record.last_step_ms:.1f} ms"
    caption.value = f"<b>{html.escape(record.entry.label)}</b> #{record.repeat}: {html.escape(text)}"


def _jupyterlab_frontend() -> Any:
    """ipylab's handle on JupyterLab when running in a kernel (created early: the front end needs time)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None or not hasattr(shell, "kernel"):
            return None
        from ipylab import JupyterFrontEnd

        return JupyterFrontEnd()
    except Exception:  # ipylab missing or broken: the fallback in _insert_cell applies
        return None
