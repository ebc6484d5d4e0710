"""The History tab: stored trials, one picked as the baseline, its configuration's step time across commits.

A thin view over `workbench.store`: the list is `Store.history`, the chart is `wb.ui.history`
for the selected trial's configuration on comparable hardware (medians and quartiles computed by
the store, not here), and the two actions hand a stored result or its config to the app through
callbacks, so this widget knows nothing of the control panel or the comparison. A broken or
missing history is a message in the tab, never an exception in the app.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from workbench.config import ConfigError, TrainConfig
from workbench.measure.result import TrialResult
from workbench.store import HistoryRow, Store, StoredTrial, StoreError, default_store_path
from workbench.ui.view_pane import ViewPane
from workbench.ui.views import ViewError, history


class HistoryView:
    """`HistoryView(store).widget` is the tab; `on_pick_baseline(result)` / `on_open_config(config)` are the exits.

    `store`: a Store (left open), a path, or None for the default history file. The
    methods the buttons call (`refresh`, `select`, `pick_baseline`, `open_config`) are
    public, so the app and tests drive the view as a user would.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str] | None = None,
        *,
        on_pick_baseline: Callable[[TrialResult], None] | None = None,
        on_open_config: Callable[[TrainConfig], None] | None = None,
        limit: int = 200,
    ) -> None:
        self.on_pick_baseline = on_pick_baseline
        self.on_open_config = on_open_config
        self.limit = limit
        self.rows: list[HistoryRow] = []
        self.selected: StoredTrial | None = None
        self._owned = not isinstance(store, Store)
        self.store, problem = _open(store)

        self.workload = widgets.Dropdown(description="Workload", options=[("all", "")], value="")
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.runs = widgets.Select(options=[], rows=12, layout=widgets.Layout(width="100%"))
        self.baseline_button = widgets.Button(description="Use as baseline", button_style="primary", disabled=True)
        self.config_button = widgets.Button(description="Open config", disabled=True)
        self.details = widgets.HTML()
        self.message = widgets.HTML()
        self.chart = ViewPane("history_series")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.workload, self.refresh_button]),
                self.runs,
                widgets.HBox([self.baseline_button, self.config_button]),
                self.details,
                self.chart.widget,
                self.message,
            ]
        )
        self.workload.observe(lambda change: self.refresh(), names="value")
        self.runs.observe(self._on_select, names="value")
        self.refresh_button.on_click(lambda button: self.refresh())
        self.baseline_button.on_click(lambda button: self.pick_baseline())
        self.config_button.on_click(lambda button: self.open_config())
        if problem:
            self._say(problem, error=True)
        self.refresh()

    # --- actions ----------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read the history (newest first), keeping the workload filter and, if still listed, the selection."""
        if self.store is None:
            return
        try:
            workloads = self.store.workloads()
            self.rows = self.store.history(workload=self.workload.value or None, limit=self.limit)
        except StoreError as exc:
            self._say(str(exc), error=True)
            return
        options = [("all", ""), *((name, name) for name in workloads)]
        if list(self.workload.options) != options:
            self.workload.options = options
        keep = self.runs.value
        self.runs.options = [(_row_label(row), row.id) for row in self.rows]
        self.runs.value = keep if keep in {row.id for row in self.rows} else None
        if not self.rows:
            self._say(f"no stored trials yet (history: {self.store.path})")

    def select(self, trial_row_id: int | None) -> None:
        """Show one stored trial: its details and its configuration's step time across commits."""
        self.runs.value = trial_row_id

    def pick_baseline(self) -> TrialResult | None:
        """Hand the selected stored result to the app as the baseline (only an 'ok' trial can be one)."""
        if self.selected is None or not self.selected.result.ok:
            self._say("pick a trial that finished 'ok' to use it as the baseline", error=True)
            return None
        if self.on_pick_baseline is not None:
            self.on_pick_baseline(self.selected.result)
        self._say(f"trial {self.selected.id} is the baseline")
        return self.selected.result

    def open_config(self) -> TrainConfig | None:
        """Hand the selected trial's configuration to the app (e.g. to load it into the control panel)."""
        if self.selected is None:
            return None
        try:
            config = TrainConfig.from_dict(self.selected.result.config)
        except ConfigError as exc:  # stored by a version with other fields
            self._say(f"this trial's config cannot be opened here: {exc}", error=True)
            return None
        if self.on_open_config is not None:
            self.on_open_config(config)
        self._say(f"opened the config of trial {self.selected.id}: {config.describe()}")
        return config

    def close(self) -> None:
        if self.store is not None and self._owned:
            self.store.close()

    # --- internals --------------------------------------------------------------------

    def _on_select(self, change: dict[str, Any]) -> None:
        row_id = change["new"]
        self.selected = None
        self.chart.clear()
        if row_id is not None and self.store is not None:
            try:
                self.selected = self.store.get(int(row_id))
                result = self.selected.result
                view = history(
                    self.store, result.workload, [result.config], environment=result.environment, preset=result.preset
                )
                self.chart.show(view)
            except (StoreError, ViewError) as exc:
                self._say(str(exc), error=True)
        ok = self.selected is not None and self.selected.result.ok
        self.baseline_button.disabled = not ok
        self.config_button.disabled = self.selected is None
        self.details.value = _details(self.selected) if self.selected is not None else ""

    def _say(self, text: str, error: bool = False) -> None:
        color = "#b00020" if error else "#555"
        self.message.value = f"<span style='color:{color}'>{html.escape(text)}</span>"


def _open(store: Store | str | os.PathLike[str] | None) -> tuple[Store | None, str]:
    if isinstance(store, Store):
        return store, ""
    path = store if store is not None else default_store_path()
    if path is None:
        return None, "the run history is off (WORKBENCH_STORE=off): no trials are stored"
    try:
        return Store(path), ""
    except StoreError as exc:
        return None, str(exc)


def _row_label(row: HistoryRow) -> str:
    when = time.strftime("%m-%d %H:%M", time.localtime(row.started_at or row.saved_at))
    median = f"{row.median_step_ms:.1f} ms" if row.median_step_ms is not None else "n/a"
    status = "" if row.status == "ok" else f"  [{row.status}]"
    return f"#{row.id}  {when}  {row.commit_label}  {row.workload}  {row.config_label}  {median}{status}"


def _details(trial: StoredTrial) -> str:
    r = trial.result
    env = r.environment
    lines = [
        f"<b>trial {trial.id}</b> (run {trial.run_id}, {html.escape(trial.label or 'single run')}) — status {r.status}",
        f"{html.escape(r.workload)} [{r.preset}], {len(r.step_ms)} timed steps after {r.warmup} warm-up; "
        f"median {r.median_step_ms or 0:.1f} ms",
        f"commit {html.escape(str(env.get('git_commit')))}, torch {env.get('torch')}, "
        f"{html.escape(str(env.get('device_name')))} on {html.escape(str(env.get('host')))}",
    ]
    if r.message:
        lines.append(html.escape(r.message.strip().splitlines()[0]))
    return "<br>".join(lines)
