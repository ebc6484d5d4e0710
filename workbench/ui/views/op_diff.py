"""`op_diff`: the A/B operator table as ranked bars of time gained and lost, and a compiled
candidate's fused kernels when its profile lists them.

The rows and their order are `analysis.trace_diff`'s (ranked by their part of the measured
step-time change); a bar is a row's self-time delta per profiled step.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.trace_diff import DiffRow, TraceDiff, TraceDiffError, diff_trials
from workbench.measure.result import TrialResult
from workbench.ui.views.base import HEIGHT, WIDTH, ViewError, hv, not_measured

GAINED, LOST = "#2ca02c", "#d62728"
VDIMS = ["delta_ms", "direction", "baseline_ms", "candidate_ms", "change", "share"]


def op_diff(diff: TraceDiff | TrialResult, candidate: TrialResult | None = None, *, top: int = 15) -> Any:
    """Bars of each operator's self-time change (candidate − baseline, ms per profiled step), largest
    contribution on top: `op_diff(trace_diff)` or `op_diff(baseline_trial, candidate_trial)`; the CUDA
    kernels' diff and the candidate's fused kernels (compiled trials) follow when measured."""
    if isinstance(diff, TrialResult):
        if not isinstance(candidate, TrialResult):
            raise ViewError("op_diff(baseline, candidate) takes two profiled TrialResults")
        try:
            diff = diff_trials(diff, candidate, top=top)
        except TraceDiffError as exc:
            raise ViewError(str(exc)) from None
    if not isinstance(diff, TraceDiff):
        raise ViewError(f"op_diff() takes a TraceDiff or two profiled TrialResults, got {type(diff).__name__}")
    panels = [_bars(diff.rows[:top], f"operators: {diff.candidate} against {diff.baseline}", "operator")]
    if diff.kernel_rows:
        panels.append(_bars(diff.kernel_rows[:top], "device kernels", "kernel"))
    fused = fused_kernels(candidate)
    if fused:
        panels.append(_fused_bars(fused[:top]))
    return hv().Layout(panels).cols(1)


def op_rows(rows: list[DiffRow]) -> list[dict[str, Any]]:
    """The bars' data, in the diff's order (largest contribution first)."""
    return [
        {
            "name": r.name,
            "delta_ms": r.delta_ms,
            "direction": "lost (slower)" if r.delta_ms > 0 else "gained (faster)",
            "baseline_ms": r.baseline_ms,
            "candidate_ms": r.candidate_ms,
            "change": r.change or "same op",
            "share": r.share,
        }
        for r in rows
    ]


def fused_kernels(candidate: TrialResult | None) -> list[dict[str, Any]]:
    """The generated (fused) kernels of a compiled candidate's profile, slowest first; [] when absent."""
    compiled = ((candidate.profile or {}).get("compiled") or {}) if candidate is not None else {}
    rows = [row for row in compiled.get("fused") or [] if isinstance(row, dict) and "name" in row]
    return sorted(rows, key=lambda row: -float(row.get("us") or 0.0))


def _bars(rows: list[DiffRow], title: str, what: str) -> Any:
    h = hv()
    if not rows:
        return not_measured(title, "the profiled windows list no operator")
    data = op_rows(list(reversed(rows)))  # horizontal bars draw bottom-up: the largest ends on top
    colors = [LOST if r["delta_ms"] > 0 else GAINED for r in data]
    return h.Bars(data, h.Dimension("name", label=what), VDIMS).opts(
        title=f"{title} (red: time lost, green: time gained)",
        invert_axes=True,
        color=h.dim("direction").categorize({"lost (slower)": LOST, "gained (faster)": GAINED}),
        tools=["hover"],
        width=WIDTH,
        height=max(HEIGHT, 22 * len(colors) + 60),
        xlabel="",
        ylabel="self time Δ, ms per profiled step",
    )


def _fused_bars(rows: list[dict[str, Any]]) -> Any:
    data = [
        {
            "name": r["name"],
            "us": float(r.get("us") or 0.0),
            "ops": ", ".join(r.get("ops") or []),
            "calls": r.get("calls"),
        }
        for r in reversed(rows)
    ]
    return (
        hv()
        .Bars(data, "name", ["us", "ops", "calls"])
        .opts(
            title="the candidate's fused kernels (what the compiler generated, with the ops each fused)",
            invert_axes=True,
            color="#9467bd",
            tools=["hover"],
            width=WIDTH,
            height=max(HEIGHT, 22 * len(data) + 60),
            xlabel="",
            ylabel="µs per profiled step",
        )
    )
