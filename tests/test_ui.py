"""The notebook app, driven the way a user drives it: set toggles, click buttons, read what it shows.

Trials really run (worker processes, small models); assertions read the widgets' values and
the charts' ColumnDataSources — what the browser would receive.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from torch import nn

from workbench import Protocol
from workbench.config import TrainConfig, field_choices, field_doc, field_names
from workbench.levers import capabilities
from workbench.protocol.rounds import half_block
from workbench.workloads import Workload

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_bokeh")

from workbench.ui import Workbench
from workbench.ui.controls import UNAVAILABLE_MARK, ChoiceControl, TextControl


class Toy(nn.Module):
    """A tiny model; `sleep_s` per forward makes a trial last; raises under autocast when told."""

    def __init__(self, sleep_s: float = 0.0, fail_under_autocast: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.sleep_s, self.fail_under_autocast = sleep_s, fail_under_autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep_s)
        if self.fail_under_autocast and torch.is_autocast_enabled("cpu"):
            raise ValueError("this model refuses autocast: bad dtype in user code")
        return self.linear(x)


def toy(sleep_s: float = 0.0, fail_under_autocast: bool = False) -> Workload:
    return Workload.from_callables(
        model_fn=lambda: Toy(sleep_s, fail_under_autocast),
        batch_fn=lambda n, g: (torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
        name="toy",
    )


@pytest.fixture
def make_app():
    apps: list[Workbench] = []

    def make(workload: Any = None, **kwargs: Any) -> Workbench:
        kwargs.setdefault("warmup", 1)
        kwargs.setdefault("steps", 4)
        app = Workbench(workload if workload is not None else toy(), **kwargs)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


def _text(html_value: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html_value))


# --- the generated control panel ------------------------------------------------------


def test_panel_has_a_control_for_every_trainconfig_field(make_app) -> None:
    app = make_app()
    assert list(app.panel.controls) == field_names()
    listed = capabilities(app.device)
    for name, control in app.panel.controls.items():
        choices = field_choices(name) or (tuple(listed[name]) if name in listed else None)
        if choices is None:
            assert isinstance(control, TextControl)
            continue
        assert isinstance(control, ChoiceControl)
        assert [value for _, value in control.buttons.options] == list(choices)
        assert control.buttons.tooltip == field_doc(name)
        assert control.value == getattr(TrainConfig(), name)
    assert app.panel.config() == TrainConfig()


def test_unavailable_choices_are_labelled_refused_and_say_why(make_app) -> None:
    app = make_app()
    unavailable = [
        (name, value, avail.reason)
        for name, table in capabilities(app.device).items()
        for value, avail in table.items()
        if not avail.available
    ]
    if not unavailable:
        pytest.skip("every toggle value is available on this device")
    for name, value, reason in unavailable:
        control = app.panel[name]
        assert isinstance(control, ChoiceControl)
        index = [v for _, v in control.buttons.options].index(value)
        assert control.buttons.options[index][0].endswith(UNAVAILABLE_MARK)
        assert reason in control.buttons.tooltips[index]
        before = control.value
        control.value = value  # what a click does
        assert control.value == before, f"{name}={value} was accepted"
        assert reason.replace("'", "&#x27;") in control.note.value
        assert reason in app.panel.unavailable.children[0].value.replace("&#x27;", "'")


def test_cuda_graphs_shows_its_reason_on_a_cpu_machine(make_app) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA graphs are available here")
    app = make_app()
    app.panel["cuda_graphs"].value = True
    assert app.panel["cuda_graphs"].value is False
    assert "CUDA graphs need a CUDA device" in app.panel["cuda_graphs"].note.value


def test_an_invalid_combination_is_refused_with_the_config_message(make_app) -> None:
    app = make_app()
    app.panel["compile_fullgraph"].value = True  # needs compile on
    app.run_baseline_button.click()
    assert "compile_fullgraph/compile_dynamic need compile on" in app.status.value
    assert app.records == [] and not app.runner.busy


def test_text_fields_parse_like_the_cli(make_app) -> None:
    app = make_app()
    app.panel["batch_size"].value = 2
    app.panel["extra"].box.value = "sample_cost_ms=3"
    app.panel["lr"].box.value = "0.01"
    config = app.panel.config()
    assert (config.batch_size, config.extra, config.lr) == (2, {"sample_cost_ms": 3}, 0.01)


# --- running, charts, table, export ---------------------------------------------------


def test_baseline_and_candidate_fill_charts_table_and_export(make_app) -> None:
    app = make_app(steps=5)
    app.run_baseline_button.click()
    app.panel["amp"].value = "bf16"
    app.run_candidate_button.click()  # queued behind the baseline: trials never overlap
    app.wait(timeout=180)

    assert [r.status for r in app.records] == ["ok", "ok"]
    pids = {r.result.worker_pid for r in app.records}
    assert os.getpid() not in pids and len(pids) == 2  # each trial in its own worker process
    starts = sorted((r.result.started_at, r.result.started_at + r.result.wall_time_s) for r in app.records)
    assert starts[0][1] <= starts[1][0] + 0.5  # one after the other

    points = app.charts.step_points.data
    baseline, candidate = app.records
    row = candidate.entry.row
    assert row is not None and row.units >= 6  # the candidate was compared by the protocol's rounds
    # its fresh trial, then each mirrored round's two half-blocks (B C | C B) of ceil(5 / 2) steps; a round
    # set aside because the host's load changed is still drawn, though it is not a unit of the interval
    rounds = row.units + len(row.load_changed_rounds)
    assert len(points["step_ms"]) == 10 + 2 * half_block((5, False))[0] * rounds
    assert points["step_ms"][:5] == pytest.approx(baseline.result.step_ms)
    assert points["step_ms"][5:10] == pytest.approx(candidate.result.step_ms)
    assert app.charts.step_lines.data["label"] == ["baseline: defaults", "candidate 1: amp=bf16"]
    assert len(app.charts.peak_memory.data["peak_mib"]) == 2
    assert app.charts.peak_memory.data["peak_mib"][0] == pytest.approx(baseline.result.peak_memory_bytes / 2**20)
    assert len(app.charts.utilization.data["t"]) > 0  # the monitor sampled during the trials
    # Each fresh trial's timed window is shaded on the timelines, on the monitor's own clock.
    spans = app.charts.trial_windows.data
    assert spans["label"] == ["baseline", "candidate 1"]
    for record, x0, x1 in zip(app.records, spans["x0"], spans["x1"]):
        start, end = record.result.timed_window
        assert (x0, x1) == pytest.approx((start * 1000.0, end * 1000.0))
        assert end - start == pytest.approx(sum(record.result.step_ms) / 1000.0, rel=0.2, abs=0.05)
    assert spans["x1"][0] <= spans["x0"][1]  # the baseline's window ends before the candidate's starts
    last_tick = max(app.charts.utilization.data["t"])  # the monitor's time.time() in ms: the same clock
    assert last_tick - 120_000.0 <= spans["x0"][0] and spans["x1"][1] <= last_tick + 1000.0

    table = _text(app.table.value)
    assert "candidate 1" in table and "amp : fp32 → bf16" in table
    assert re.search(r"\d+\.\d\d× \[\d+\.\d\d, \d+\.\d\d\]", table)
    assert re.search(r"faster|slower|no significant difference|inconclusive", table)
    assert re.search(r"\d+ rounds", table) and "round(s): paired rounds" in table
    assert "MiB" in table and "ok" in table
    assert re.search(r"\d\.\d\d of \d+ cores \([+-]\d\.\d\d\)", table)  # the candidate's CPU use, Δ vs baseline

    labels = [label for label, _ in app.export.choice.options]
    assert labels[0] == "baseline: defaults" and labels[1].startswith("candidate 1: amp=bf16")
    app.export.choice.value = 1
    assert "torch.autocast" in app.export.snippet.value and "bfloat16" in app.export.snippet.value
    payload = re.search(r"base64,([A-Za-z0-9+/=]+)", app.export.download.value).group(1)
    assert TrainConfig.from_json(base64.b64decode(payload).decode()) == TrainConfig(amp="bf16")
    assert "navigator.clipboard" in app.export.copy.value
    assert "Finished" in app.status.value

    # The Diagnosis tab counted the FLOPs of the app's own workload object (which no name rebuilds).
    from workbench.analysis.flops import step_flops

    shown = app.diagnosis.diagnosis
    assert app.diagnosis.result is candidate.result and shown is not None and shown.mfu is not None
    assert shown.mfu.flops_per_step == step_flops(app.workload_picker.value, TrainConfig(amp="bf16")).total


def test_charts_update_while_the_trial_runs(make_app) -> None:
    app = make_app(toy(sleep_s=0.15), steps=16, refresh_hz=4.0)
    app.run_baseline_button.click()
    deadline = time.monotonic() + 120
    seen: list[int] = []
    while time.monotonic() < deadline and app.records[0].result is None:
        seen.append(len(app.charts.step_points.data["step_ms"]))
        time.sleep(0.25)
    app.wait(timeout=120)
    growing = sorted(set(seen) - {0, 16})
    assert len(growing) >= 3, f"the chart did not grow during the trial: {seen}"
    assert app.records[0].bar.value == 17 and app.records[0].bar.bar_style == "success"


def test_cancel_stops_the_running_trial_and_the_queue(make_app) -> None:
    app = make_app(toy(sleep_s=0.2), steps=10_000)
    app.run_baseline_button.click()
    app.run_candidate_button.click()  # queued
    deadline = time.monotonic() + 120
    while app.records[0].steps_done < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not app.cancel_button.disabled
    begin = time.monotonic()
    app.cancel_button.click()
    app.wait(timeout=30)
    assert time.monotonic() - begin < 15
    assert [r.status for r in app.records] == ["cancelled", "cancelled"]
    assert "cancelled" in _text(app.table.value)
    assert app.cancel_button.disabled
    app.steps.value = 3
    app.workload_picker.value = app.workload_picker.options[0][1]
    assert app.run_baseline() is not None  # the app keeps working after a cancel


def test_an_erroring_trial_is_a_readable_row_and_the_app_keeps_working(make_app) -> None:
    app = make_app(toy(fail_under_autocast=True), steps=3)
    app.run_baseline_button.click()
    app.panel["amp"].value = "bf16"
    app.run_candidate_button.click()
    app.panel["amp"].value = "fp32"
    app.panel["seed"].value = 1
    app.run_candidate_button.click()
    app.wait(timeout=180)
    assert [r.status for r in app.records] == ["ok", "error", "ok"]
    table = _text(app.table.value)
    assert "error : ValueError: this model refuses autocast: bad dtype in user code" in table
    assert "failed" in table
    assert "seed : 0 → 1" in table
    assert app.records[1].bar.bar_style == "danger"


def test_a_candidate_is_compared_by_the_protocol_against_the_finished_baseline(make_app) -> None:
    """The app's controls feed the one protocol: the baseline's trial is re-used (not re-run), the
    candidate's rounds stream into its progress caption, and a 2x-slower step (the sleeping
    forward runs twice per step with grad_accumulation=2) is called slower."""
    app = make_app(toy(sleep_s=0.01), steps=3)
    app.precision.value, app.budget.value = 4.0, 20
    app.run_baseline_button.click()
    app.panel["grad_accumulation"].value = 2
    captions: set[str] = set()
    app.run_candidate_button.click()
    # Every caption the candidate's record shows, as it is set (polling would miss a short-lived one).
    app.records[-1].caption.observe(lambda change: captions.add(_text(change["new"])), names="value")
    app.wait(timeout=240)
    baseline, candidate = app.entries
    assert len(baseline.results()) == 1 and len(candidate.results()) == 1
    comparison = candidate.comparison
    assert comparison is not None and comparison.precision == pytest.approx(0.04)
    assert comparison.baseline.trial_ids == [baseline.results()[0].trial_id]  # re-used, not measured again
    assert candidate.row is not None and candidate.row.verdict == "slower" and candidate.row.units >= 6
    # The rounds stream in (before the 6-round floor they say so; the round that meets the target
    # may be drawn in the same refresh as the verdict, which then replaces it).
    rounds = {int(m.group(1)) for c in captions if (m := re.search(r"round (\d+): (±\d+\.\d%|too few rounds)", c))}
    assert len(rounds) >= 3, captions
    table = _text(app.table.value)
    assert "slower" in table and "target ±4.0%" in table and "noise: step-to-step" in table
    assert app.export.choice.value == 0  # nothing faster: the export stays on the baseline


def test_the_apps_protocol_sets_the_rest_and_its_fields_set_precision_and_budget(make_app) -> None:
    """A notebook may ask for fewer rounds or one paired worker; the two fields still decide precision and budget."""
    chosen = Protocol(budget_s=8, confidence=0.8, min_rounds=4, paired_workers=1)
    assert make_app(protocol=chosen)._spec().protocol == chosen
    app = make_app(protocol=chosen, budget_s=9)
    app.precision.value = 5.0
    assert app._spec().protocol == dataclasses.replace(chosen, precision=0.05, budget_s=9.0)
    assert make_app()._spec().protocol == Protocol()


def test_candidate_with_a_different_window_than_the_baseline_is_refused(make_app) -> None:
    app = make_app(steps=3)
    app.run_baseline_button.click()
    app.steps.value = 7
    assert app.run_candidate() is None
    assert "run a new baseline" in app.status.value
    app.wait(timeout=120)


# --- the race with the browser view, display, export actions --------------------------


def test_a_new_view_gets_the_full_state_again(make_app) -> None:
    """BokehJS sends DocumentReady when a view renders; the app then re-sends every source."""
    from workbench.ui.charts import TrialSeries

    app = make_app()
    app.charts.set_trials([TrialSeries(1, "baseline: defaults", "#222", [5.0, 6.0, 7.0], 3 * 2**20)])
    sent: list[dict[str, Any]] = []
    model = app.charts.widget
    model.send = lambda content, buffers=None: sent.append(content)
    ready = {
        "event": "jsevent",
        "kind": "MessageSent",
        "msg_type": "bokeh_event",
        "msg_data": {"type": "event", "name": "document_ready", "values": {"type": "map", "entries": []}},
    }
    model._sync_model(model, ready, [])
    assert app.charts.ready_count == 1
    payloads = " ".join(m.get("payload", "") for m in sent if isinstance(m.get("payload"), str))
    assert '"step_ms",[5.0,6.0,7.0]' in payloads.replace(" ", "")
    assert "peak_mib" in payloads


def test_displaying_the_app_shows_its_root_widget(make_app, monkeypatch) -> None:
    import workbench.ui.app as app_module

    loads: list[bool] = []
    monkeypatch.setattr(app_module, "load_bokehjs", lambda force=False: loads.append(True))
    app = make_app()
    bundle = app._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == app.widget.model_id
    assert loads == [True]


def test_insert_as_next_cell_uses_jupyterlab_commands(make_app) -> None:
    class Commands:
        def __init__(self) -> None:
            self.calls: list[tuple[str, Any]] = []

        def execute(self, command: str, args: Any = None) -> None:
            self.calls.append((command, args))

    class FrontEnd:
        commands = Commands()

    app = make_app()
    app.export.snippet.value = "print('hello')"
    app._frontend = FrontEnd()
    app.export.insert.click()
    assert FrontEnd.commands.calls == [
        ("notebook:insert-cell-below", None),
        ("notebook:replace-selection", {"text": "print('hello')"}),
    ]
    assert "Inserted" in app.export.message.value


def test_workload_picker_lists_builtins_and_the_callers_workload(make_app) -> None:
    from workbench.workloads import builtin_workloads

    mine = toy()
    app = make_app(mine)
    values = [v for _, v in app.workload_picker.options]
    assert values[0] is mine and set(values[1:]) == set(builtin_workloads())
    assert app.preset_picker.disabled  # a Workload object comes with its own size
    named = make_app("e2e-planner")
    assert named.workload_picker.value == "e2e-planner" and not named.preset_picker.disabled


def test_the_core_library_imports_without_ui_packages() -> None:
    """The GPU machine has no Jupyter stack: nothing outside workbench.ui may import it."""
    code = (
        "import sys\n"
        "for name in ('ipywidgets', 'bokeh', 'holoviews', 'jupyter_bokeh', 'ipylab'):\n"
        "    sys.modules[name] = None  # any import of these now fails\n"
        "import workbench.api, workbench.cli, workbench.export, workbench.measure.monitor\n"
        "from workbench.measure.monitor import DeviceMonitor\n"
        "DeviceMonitor().sample_now()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_ui_modules_import_one_way() -> None:
    """No cycle among workbench.ui's modules, counting imports inside functions and under TYPE_CHECKING
    (an import moved out of sight to dodge a cycle is still a cycle)."""
    import ast
    import graphlib
    from pathlib import Path

    import workbench.ui

    graph: dict[str, set[str]] = {}
    for path in Path(workbench.ui.__file__).parent.glob("*.py"):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[f"workbench.ui.{path.stem}"] = {name for name in imported if name.startswith("workbench.ui.")}
    assert "workbench.ui.app" in graph["workbench.ui.__init__"]  # the scan sees imports
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the modules of a cycle


def test_messages_are_html_escaped(make_app) -> None:
    app = make_app()
    app.panel["compile"].value = "default"
    app.panel["compile_backend"].box.value = "<img src=x onerror=alert(1)>"
    app.run_baseline_button.click()
    assert "is not registered" in app.status.value
    assert "<img" not in app.status.value and "&lt;img" in app.status.value


def test_diagnosis_and_history_tabs_are_wired_into_the_app() -> None:
    """A stored trial becomes the baseline from the History tab; a finished trial is diagnosed."""
    from workbench.config import TrainConfig
    from workbench.measure import TrialRequest
    from workbench.store import Store
    from workbench.trials import run_trial
    from workbench.ui import Workbench

    stored = run_trial("bev-perception", TrainConfig(), steps=2, warmup=1, isolation="inline", track_memory=False)
    with Store() as store:  # the tests' store (WORKBENCH_STORE points at a temp file)
        store.recorder("run").save(stored)
    app = Workbench()
    try:
        window = TrialRequest("bev-perception")  # the API's default window is the app's (and the CLI's)
        assert (app.warmup.value, app.steps.value) == (window.warmup, window.steps)
        tabs = app.widget.children[-1]
        assert list(tabs.titles) == ["Diagnosis of the latest run", "History", "Tune", "Timeline"]
        app.history.refresh()
        entry = app.use_stored_baseline(stored)
        assert entry.role == "baseline" and entry.results() == [stored]
        assert "baseline" in app.table.value
        app._show_results()
        assert app.diagnosis.result is stored
    finally:
        app.close()


def test_per_rank_step_times_of_a_distributed_trial_are_listed() -> None:
    from workbench.measure import TrialResult
    from workbench.ui.table import render_ranks

    ranks = [{"rank": r, "host": "node0", "median_step_ms": 100.0 + 50 * r, "compute_ms": 80.0, "comm_ms": 20.0,
              "exposed_comm_ms": 5.0} for r in range(2)]  # fmt: skip
    result = TrialResult(trial_id="d", status="ok", workload="e2e-planner", config={}, distributed={"ranks": ranks})
    text = render_ranks(result)
    assert "<td>1</td><td>node0</td><td>150.0</td>" in text  # the straggler's median shows
    assert render_ranks(TrialResult(trial_id="s", status="ok", workload="w", config={})) == ""


def test_the_history_tab_lists_a_trial_as_soon_as_it_finishes(make_app) -> None:
    app = make_app(steps=2)
    before = {row.id for row in app.history.rows}
    app.run_baseline_button.click()
    app.wait(timeout=180)
    assert [r.status for r in app.records] == ["ok"]
    new = [row for row in app.history.rows if row.id not in before]  # no Refresh clicked
    assert [row.trial_id for row in new] == [app.records[0].result.trial_id]
    assert new[0].id in {value for _, value in app.history.runs.options}
