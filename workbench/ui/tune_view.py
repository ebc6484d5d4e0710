"""The app's Tune tab: narrow the space, start a search, watch trials arrive, cancel, export the winner.

Thin over `workbench.tune.tune`: the search runs on one background thread and its
`on_update` stream is the only writer of this view (the trials table, the best so far, and
`wb.ui.pareto` of cost against peak memory: the screening front while it runs, the verified
winner once it is done).
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from workbench.config import ConfigError, TrainConfig
from workbench.textfmt import format_bytes, parse_bytes
from workbench.ui.exporter import ExportPanel
from workbench.ui.view_pane import ViewPane
from workbench.ui.views import pareto

MAX_ROWS = 40
"""Trials the table shows (newest last); the JSON and the store keep every one."""


class TuneView:
    """`spec()` returns the run's workload, preset, device and window (the app's current choices)."""

    def __init__(self, spec: Callable[[], dict[str, Any]], insert_cell: Callable[[str], str]) -> None:
        self.spec = spec
        self.budget = widgets.BoundedIntText(value=300, min=20, max=24 * 3600, description="budget s",
                                             layout=widgets.Layout(width="180px"))  # fmt: skip
        self.max_memory = widgets.Text(value="", placeholder="e.g. 20GiB", description="max memory",
                                       layout=widgets.Layout(width="240px"))  # fmt: skip
        self.objective = widgets.Dropdown(options=["auto", "throughput", "step-time"], value="auto",
                                          description="objective", layout=widgets.Layout(width="240px"))  # fmt: skip
        self.planned_steps = widgets.BoundedIntText(value=10_000, min=1, max=10**9, description="planned steps",
                                                    layout=widgets.Layout(width="220px"))  # fmt: skip
        self.start_button = widgets.Button(description="Tune", button_style="primary", icon="search")
        self.cancel_button = widgets.Button(description="Cancel", button_style="danger", icon="stop", disabled=True)
        self.start_button.on_click(lambda _: self.start())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.fields = widgets.VBox([])
        self.status = widgets.HTML("")
        self.best = widgets.HTML("")
        self.trials = widgets.HTML("")
        self.export = ExportPanel(insert_cell)
        self.chart = ViewPane("pareto")
        self._shown: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.result: Any = None
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._selectors: dict[str, tuple[widgets.SelectMultiple, tuple[Any, ...]]] = {}
        self.widget = widgets.VBox([
            widgets.HTML("<b>Search the levers</b>: Optuna screens configurations, the comparison protocol "
                         "verifies the best against the baseline. Narrow the space below (every value this "
                         "device runs is offered)."),
            self.fields,
            widgets.HBox([self.budget, self.max_memory, self.objective, self.planned_steps]),
            widgets.HBox([self.start_button, self.cancel_button]),
            self.status, self.best, self.chart.widget, self.trials,
            widgets.Accordion(children=[self.export.widget], titles=("Export the tuned winner",)),
        ])  # fmt: skip

    # --- actions ------------------------------------------------------------------------

    def refresh_space(self) -> None:
        """One multi-select per searchable field: the default space's values chosen, every other value
        this device runs offered too (widening: compile max-autotune, ...)."""
        from workbench.levers import capabilities
        from workbench.tune import default_space
        from workbench.workloads import load_workload

        spec = self.spec()
        workload = spec["workload"]
        wl = load_workload(workload, preset=spec["preset"]) if isinstance(workload, str) else workload
        space = default_space(wl.batch_size, spec["device"])
        caps = capabilities(spec["device"])
        self._selectors = {}
        boxes = []
        for name, chosen in space.values.items():
            values = (*chosen, *(v for v, a in caps.get(name, {}).items() if a.available and v not in chosen))
            if len(values) < 2:
                continue
            picked = tuple(i for i, v in enumerate(values) if v in chosen)
            select = widgets.SelectMultiple(options=[(str(v), i) for i, v in enumerate(values)], value=picked,
                                            description=name, rows=min(4, len(values)),
                                            style={"description_width": "150px"}, layout=widgets.Layout(width="330px"))  # fmt: skip
            self._selectors[name] = (select, values)
            boxes.append(select)
        self.fields.children = [widgets.GridBox(boxes, layout=widgets.Layout(grid_template_columns="repeat(3, 340px)"))]

    def space(self) -> dict[str, list[Any]]:
        """The space as chosen: field -> the selected values."""
        if not self._selectors:
            self.refresh_space()
        return {name: [values[i] for i in select.value] for name, (select, values) in self._selectors.items()}

    def start(self) -> bool:
        """Start a search in the background; False (with the reason shown) when the input is refused."""
        if self._thread is not None and self._thread.is_alive():
            self._say("a search is already running: cancel it first", error=True)
            return False
        try:
            space = self.space()
            max_memory = parse_bytes(self.max_memory.value) if self.max_memory.value.strip() else None
        except ConfigError as exc:
            self._say(str(exc), error=True)
            return False
        self.rows, self.result = [], None
        self._cancel = threading.Event()
        self._shown = []
        self.chart.clear()
        self.trials.value = self.best.value = ""
        options = dict(budget_s=float(self.budget.value), space=space, objective=self.objective.value,
                       planned_steps=int(self.planned_steps.value), max_memory_bytes=max_memory)  # fmt: skip
        self._thread = threading.Thread(target=self._run, args=(options,), name="workbench-tune", daemon=True)
        self.start_button.disabled, self.cancel_button.disabled = True, False
        self._say("starting: the baseline runs first (profiled, its diagnosis seeds the search)")
        self._thread.start()
        return True

    def cancel(self) -> None:
        self._cancel.set()
        self._say("cancelling: the running trial stops within a second")

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the search's stream ------------------------------------------------------------

    def _run(self, options: dict[str, Any]) -> None:
        from workbench.tune import tune

        spec = self.spec()
        try:
            found = tune(
                spec["workload"],
                preset=spec["preset"],
                device=spec["device"],
                warmup=spec["warmup"],
                steps=spec["steps"],
                cancel=self._cancel,
                on_update=self.on_update,
                **options,
                **spec.get("trial_options", {}),
            )
            # Drawn from the TuneResult itself, not its summary: a trial refused for its numerics or
            # memory is placed by its measured cost, coloured by its verdict.
            self.chart.show(pareto(found))
        except ConfigError as exc:
            self._say(str(exc), error=True)
        except Exception as exc:  # the view must survive anything the search raises, and say it
            self._say(f"the search stopped: {type(exc).__name__}: {exc}", error=True)
        finally:
            self.start_button.disabled, self.cancel_button.disabled = False, True

    def on_update(self, update: dict[str, Any]) -> None:
        """One event of `tune`'s stream: a trial finished, a rung ended, or the search is done."""
        event = update.get("event")
        if event == "baseline":
            self._say("baseline measured; screening")
        elif event == "trial":
            self.rows.append(update["trial"])
            self._render_trials()
            self._say(f"screening: {len(self.rows)} trials, {update['elapsed_s']:.0f} s of {update['budget_s']:.0f} s")
        elif event == "rung":
            rung = update["rung"]
            self._say(f"{rung['name']}: {rung['rounds']} protocol rounds ({html.escape(rung['stop_reason'])})")
        elif event == "done":
            self.result = update["result"]
            self._render_done(update["result"])

    def _render_trials(self) -> None:
        feasible = [r for r in self.rows if r["cost_ms"] is not None]
        if feasible:
            best = min(feasible, key=lambda r: r["cost_ms"])
            self.best.value = (f"best so far by screening (one process each, no interval yet): trial {best['number']} "
                               f"{html.escape(_params(best['params']))} at {best['cost_ms']:.3g} ms")  # fmt: skip
        self.trials.value = render_trials(self.rows[-MAX_ROWS:])
        self._show_screening(self.rows)

    def _render_done(self, data: dict[str, Any]) -> None:
        best = data.get("best")
        if best is None:
            self.best.value = f"<b>no verified result</b>: {html.escape(data.get('stop_reason', ''))}"
        else:
            ci = best["speedup_ci"]
            interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
            head = "Winner" if best["winner"] else "Fastest contender (not significantly better than the baseline)"
            ties = "".join(f"<br>not significantly worse: {html.escape(r['describe'])} ({r['speedup']:.2f}x)"
                           for r in data.get("runner_ups", []))  # fmt: skip
            self.best.value = (f"<b>{head}</b>: {html.escape(best['describe'])} — {best['speedup']:.2f}x{interval} "
                               f"over the baseline ({html.escape(best['verdict'])}){ties}")  # fmt: skip
            self.export.set_choices([(f"tuned: {best['describe']}", TrainConfig.from_dict(best["config"]))], 0)
        space = data.get("space", {})
        self._say(f"done: {html.escape(data.get('stop_reason', ''))}; {len(data.get('trials', []))} trials of "
                  f"{space.get('valid_configs') or '?'} valid configurations, {space.get('refused_combinations', 0)} "
                  f"refused combinations never run; {data.get('budget_used_s', 0):.0f} s")  # fmt: skip

    # --- the Pareto chart -----------------------------------------------------------------

    def _show_screening(self, rows: list[dict[str, Any]]) -> None:
        """The trials so far with the screening front (by the tuner's own `pareto_front`), redrawn
        only when a trial with a cost and a peak arrived."""
        from workbench.tune import pareto_front

        points = [r for r in rows if r["cost_ms"] is not None and r["peak_memory_bytes"] is not None]
        if points == self._shown:
            return
        self._shown = list(points)
        front = pareto_front([(r["cost_ms"], r["peak_memory_bytes"]) for r in points])
        self.chart.show(pareto({"trials": points, "pareto": [points[i] for i in front]}))

    def _say(self, text: str, error: bool = False) -> None:
        style = "color:#b00020" if error else "color:#333"
        self.status.value = f"<span style='{style}'>{html.escape(text) if error else text}</span>"


def render_trials(rows: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("#", "stage", "config", "status", "cost ms", "peak", "reason"))
    body = []
    for r in rows:
        cost = f"{r['cost_ms']:.3g}" if r["cost_ms"] is not None else "—"
        cells = [r["number"], r["stage"], _params(r["params"]), r["status"], cost, format_bytes(r["peak_memory_bytes"]),
                 (r["reason"] or "")[:80]]  # fmt: skip
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table class='workbench-tune-trials'><tr>{head}</tr>{''.join(body)}</table>"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "baseline values"
