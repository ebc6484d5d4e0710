"""`history`: steady step time per commit, one curve per configuration, the regressions marked.

The points are `store.series.config_series` (medians and quartiles pooled there); a regression
is the point holding a trial that `regress` flagged. Commits sit in first-measured order, the
order a regression hunt reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from workbench.analysis.regress import RegressionReport
from workbench.config import TrainConfig
from workbench.store import Store, StoreError
from workbench.store.series import SeriesPoint, config_series
from workbench.ui.views.base import FLAG_COLOR, HEIGHT, WIDTH, ViewError, hv, not_measured, opened_store

VDIMS = ["median_ms", "config", "commit", "device", "q1_ms", "q3_ms", "trials"]
"""Plotted (the first) and carried to the hover."""
TOOLTIPS = [
    ("commit", "@commit"),
    ("device", "@device"),
    ("config", "@config"),
    ("median ms", "@median_ms{0.0}"),
    ("quartiles ms", "@q1_ms{0.0} – @q3_ms{0.0}"),
    ("trials", "@trials"),
]


def history(
    store: Store | str | os.PathLike[str] | None,
    workload: str,
    configs: Sequence[TrainConfig | dict[str, Any]] | None = None,
    *,
    regressions: RegressionReport | Iterable[str] | None = None,
    environment: dict[str, Any] | str | None = None,
    preset: str | None = None,
) -> Any:
    """Median step time per commit with its quartiles for each configuration of `workload` (every
    stored one when `configs` is None); `regressions` (a `RegressionReport` or flagged trial ids)
    marks the commits that regressed. Hover shows the commit, the device and the trials behind a point."""
    series = _read(store, workload, configs, environment, preset)
    if not series:
        return not_measured(f"step time across commits ({workload})", "no 'ok' trial of it is stored yet")
    rows, ticks = history_rows(series)
    flagged = flagged_trials(regressions)
    h = hv()
    layers = []
    for color, label in zip(h.Cycle.default_cycles["default_colors"] * 4, series):
        data = [row for row in rows if row["config"] == label]
        layers.append(h.ErrorBars(_bars(data), ["x"], ["median_ms", "low", "high"], label=label).opts(color=color))
        layers.append(h.Curve(data, ["x"], VDIMS, label=label).opts(color=color))
        scatter = h.Scatter(data, ["x"], VDIMS, label=label)
        layers.append(scatter.opts(color=color, size=7, tools=["hover"], hover_tooltips=TOOLTIPS))
    marked = [row for row, point in _with_points(rows, series) if flagged & set(point.trial_ids)]
    layers.append(
        h.Scatter(marked, ["x"], VDIMS, label="regression").opts(
            color=FLAG_COLOR, marker="x", size=16, line_width=3, tools=["hover"], hover_tooltips=TOOLTIPS
        )
    )
    return h.Overlay(layers).opts(
        title=f"{workload}: median step time per commit (bars: quartiles; x: a regression flagged)",
        width=WIDTH,
        height=HEIGHT,
        xlabel="commit (first measured → last)",
        ylabel="step ms",
        xticks=ticks,
        xrotation=35,
        legend_position="top_left",
        padding=0.1,
    )


def history_rows(series: dict[str, list[SeriesPoint]]) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """One row per (configuration, commit), x being the commit's place among every series' commits."""
    order: dict[str | None, float] = {}
    for points in series.values():
        for point in points:
            order[point.commit] = min(order.get(point.commit, point.first_started_at), point.first_started_at)
    place = {commit: i for i, commit in enumerate(sorted(order, key=lambda c: order[c]))}
    labels = {point.commit: point.label for points in series.values() for point in points}
    rows = [
        {
            "config": label,
            "x": place[p.commit],
            "commit": p.commit or p.label,
            "median_ms": p.median_step_ms,
            "q1_ms": p.q1_step_ms,
            "q3_ms": p.q3_step_ms,
            "trials": p.trials,
            "device": p.device,
        }
        for label, points in series.items()
        for p in points
    ]
    return rows, [(i, labels[commit]) for commit, i in place.items()]


def flagged_trials(regressions: RegressionReport | Iterable[str] | None) -> set[str]:
    """The trial ids of the rows `regress` failed as a regression."""
    if regressions is None:
        return set()
    if isinstance(regressions, RegressionReport):
        return {tid for row in regressions.rows if row.status == "regression" for tid in row.current_trial_ids}
    if isinstance(regressions, str):
        raise ViewError("regressions must be a RegressionReport or a list of trial ids, not one string")
    return {str(tid) for tid in regressions}


def _read(store: Any, workload: str, configs: Any, environment: Any, preset: Any) -> dict[str, list[SeriesPoint]]:
    if not isinstance(workload, str) or not workload:
        raise ViewError(f"workload must be a workload name as stored, got {workload!r}")
    with opened_store(store) as db:
        try:
            return config_series(db, workload, configs, environment=environment, preset=preset)
        except StoreError as exc:
            raise ViewError(str(exc)) from None


def _bars(rows: list[dict[str, Any]]) -> list[tuple[float, float, float, float]]:
    return [(r["x"], r["median_ms"], r["median_ms"] - r["q1_ms"], r["q3_ms"] - r["median_ms"]) for r in rows]


def _with_points(rows: list[dict[str, Any]], series: dict[str, list[SeriesPoint]]) -> list[tuple[dict, SeriesPoint]]:
    points = [p for ps in series.values() for p in ps]
    return list(zip(rows, points))
