"""`data_pipeline`: where a batch's time goes in the loader, and the ideal-loader bound, when measured.

Both are the measurement's own figures: the stage summary of a trial run with `data_stages=True`
(each stage's mean and p90, per sample or per batch) and the bound the comparison protocol
measured (the step on the real loader against the same step on batches staged on the device).
A stage or bound that was not measured is said so, never drawn as 0.
"""

from __future__ import annotations

from typing import Any

from workbench.measure.result import TrialResult
from workbench.ui.views.base import HEIGHT, WIDTH, ViewError, hv, not_measured

STAGE_VDIMS = ["mean_ms", "p90_ms", "per", "count"]
NO_STAGES = "run the trial with data stages on to time each stage where the batch is prepared"
NO_BOUND = "measure the loader bound (the step on batches already staged on the device)"


def data_pipeline(source: TrialResult | dict[str, Any] | None = None, bound: Any = None) -> Any:
    """The loader stage breakdown of `source` (a trial run with data stages, or its `data_stages`
    summary) and the ideal-loader `bound` (a loader bound or its `to_dict()`); each one that is
    missing is a "not measured" panel saying how to measure it."""
    summary, figures = stage_summary(source), bound_figures(bound)
    stages = _stages(summary) if summary else not_measured("loader stages", NO_STAGES)
    ideal = _bound(figures) if figures else not_measured("ideal-loader bound", NO_BOUND)
    return hv().Layout([stages, ideal]).cols(1)


def stage_summary(source: Any) -> dict[str, Any] | None:
    """The stage summary ({'stages', 'not_measured', ...}) of a trial or as given; None when absent."""
    if source is None:
        return None
    summary = getattr(source, "data_stages", None) if isinstance(source, TrialResult) else source
    if summary is None:
        return None
    if not isinstance(summary, dict) or not isinstance(summary.get("stages"), dict):
        raise ViewError("data_pipeline() takes a TrialResult or a data-stages summary {'stages': {...}, ...}")
    return summary


def stage_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured stage, in the order the pipeline runs them."""
    return [
        {
            "stage": name,
            "mean_ms": s["mean_ms"],
            "p90_ms": s.get("p90_ms"),
            "per": s.get("per", ""),
            "count": s.get("count", 0),
        }
        for name, s in summary["stages"].items()
        if s.get("mean_ms") is not None
    ]


def bound_figures(bound: Any) -> dict[str, Any] | None:
    """The bound's figures as a dict; None when not measured."""
    if bound is None:
        return None
    figures = bound if isinstance(bound, dict) else getattr(bound, "to_dict", lambda: None)()
    if not isinstance(figures, dict) or "ideal_step_ms" not in figures:
        raise ViewError("bound must be a loader bound (its to_dict() has 'loader_step_ms' and 'ideal_step_ms')")
    if figures.get("ideal_step_ms") is None or figures.get("loader_step_ms") is None:
        return None
    return figures


def _stages(summary: dict[str, Any]) -> Any:
    h = hv()
    rows = stage_rows(summary)
    missing = "; ".join(f"{name}: not measured ({why})" for name, why in (summary.get("not_measured") or {}).items())
    title = "loader stages: mean ms (hover: p90, per sample or per batch)" + (f" — {missing}" if missing else "")
    if not rows:
        return not_measured("loader stages", "no batch was prepared in the timed window")
    return h.Bars(rows, "stage", STAGE_VDIMS).opts(
        title=title, invert_axes=True, tools=["hover"], width=WIDTH, height=HEIGHT, color="#17becf", ylabel="ms"
    )


def _bound(figures: dict[str, Any]) -> Any:
    rows = [
        {"step": "real loader", "ms": figures["loader_step_ms"]},
        {"step": "ideal loader (batches staged on the device)", "ms": figures["ideal_step_ms"]},
    ]
    sentence = figures.get("sentence") or f"verdict: {figures.get('verdict', '')}"
    return (
        hv()
        .Bars(rows, "step", "ms")
        .opts(
            title=sentence,
            invert_axes=True,
            tools=["hover"],
            width=WIDTH,
            height=160,
            color="#8c564b",
            ylabel="step ms",
        )
    )
