"""`ranks`: each rank's step, compute, communication wait and data wait, the straggler marked.

The figures are the straggler rule's own per-rank medians (`analysis.stragglers.RankPace`), read
from a distributed trial or a watched torchrun job, so the chart and the diagnosis name the same
rank. A figure a rank did not measure is left out, never drawn as 0.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.ranks import straggler_check
from workbench.analysis.stragglers import StragglerCheck
from workbench.measure.result import TrialResult
from workbench.ui.views.base import HEIGHT, WIDTH, ViewError, hv, not_measured
from workbench.watch.job import WatchedJob

FIGURE_COLORS = {"step": "#1f77b4", "compute": "#2ca02c", "communication wait": "#ff7f0e", "data wait": "#9467bd"}


def ranks(source: TrialResult | WatchedJob | StragglerCheck) -> Any:
    """Grouped bars per rank (median ms per step) from a distributed `TrialResult`, a watched job
    (`wb.watch.watched_job(...)`) or a `StragglerCheck`; the straggler's label says so, with its cause."""
    check = rank_check(source)
    if check is None or not check.ranks:
        return not_measured("per-rank figures", "a distributed trial or a watched torchrun job has them")
    rows = rank_rows(check)
    title = "per-rank median per step"
    if check.straggler is not None:
        title += f" — straggler: rank {check.straggler} ({check.cause}, {check.late_ms:.1f} ms late)"
    elif check.contention is not None:
        title += " — host busy: no rank blamed"
    h = hv()
    return h.Bars(rows, ["rank", "figure"], ["ms", "late_ms"]).opts(
        title=title,
        color=h.dim("figure").categorize(FIGURE_COLORS),
        tools=["hover"],
        width=WIDTH,
        height=HEIGHT,
        xlabel="",
        ylabel="ms per step",
        multi_level=True,
    )


def rank_check(source: Any) -> StragglerCheck | None:
    """The straggler rule's verdict on `source`'s ranks."""
    if isinstance(source, StragglerCheck):
        return source
    if isinstance(source, TrialResult):
        return straggler_check(source)
    if isinstance(source, WatchedJob):
        return source.check
    raise ViewError(
        f"ranks() takes a distributed TrialResult, a watched job or a StragglerCheck, got {type(source).__name__}"
    )


def rank_rows(check: StragglerCheck) -> list[dict[str, Any]]:
    """One row per (rank, figure) that was measured; the straggler's rank label is marked."""
    rows = []
    for pace in sorted(check.ranks, key=lambda p: p.rank):
        label = f"rank {pace.rank}" + (" (straggler)" if pace.rank == check.straggler else "")
        compute = [v for v in (pace.forward_ms, pace.backward_ms, pace.optimizer_ms) if v is not None]
        values = {
            "step": pace.step_ms,
            "compute": sum(compute) if compute else None,
            "communication wait": pace.wait_ms,
            "data wait": pace.data_ms,
        }
        rows += [
            {"rank": label, "figure": name, "ms": value, "late_ms": pace.late_ms}
            for name, value in values.items()
            if value is not None
        ]
    return rows
