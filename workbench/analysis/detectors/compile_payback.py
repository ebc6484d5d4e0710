"""Compile time not recovered: the planned run is too short for the compile to pay itself back.

Reads the compiled trial's compile time and median step against an uncompiled baseline's (given by
the caller: `diagnose(result, baseline=...)`), and the planned run's length. The break-even is the
comparison's own (`analysis.compare.break_even_steps`: extra compile ÷ per-step saving); here it is
judged against the run the user plans. A single trial's medians are a point estimate; the calibrated
figure is `compare`'s break-even column, which uses the same formula with the paired speedup.
"""

from __future__ import annotations

from workbench.analysis.advice import Recommendation
from workbench.analysis.compare import break_even_steps
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding


def find(ev: Evidence) -> list[Finding]:
    result, base = ev.result, ev.baseline
    if ev.ctx.config.compile == "off" or base is None or not base.ok:
        return []
    step, base_step = result.median_step_ms, base.median_step_ms
    extra_s = (result.compile_time_s or 0.0) - (base.compile_time_s or 0.0)
    if not step or not base_step or extra_s <= 0:
        return []
    speedup = base_step / step
    steps = break_even_steps(base_step, speedup, extra_s)
    if steps is not None and steps <= ev.planned_steps:
        return []
    paid = (
        f"it pays back after {steps:,.0f} steps, beyond the planned {ev.planned_steps:,} steps"
        if steps is not None
        else f"the compiled step is not faster ({step:.1f} vs {base_step:.1f} ms), so it never pays back"
    )
    finding = Finding(
        kind="compile",
        severity="bottleneck",
        title="Compile time not recovered",
        summary=f"{extra_s:.1f} s of compile for {speedup:.2f}x on a {base_step:.1f} ms step: {paid}",
        evidence={
            "extra_compile_s": extra_s,
            "speedup": speedup,
            "break_even_steps": steps,
            "planned_steps": ev.planned_steps,
            "baseline": base.trial_id,
        },
        score=min(1.0, extra_s * 1000.0 / (ev.planned_steps * base_step)),  # the compile's share of the run
        recommendations=ev.ctx.offer(_fixes(ev, steps)),
    )
    return [finding]


def _fixes(ev: Evidence, steps: float | None) -> list[Recommendation]:
    shorter = Recommendation(
        "Compile the default way (no autotuning)",
        {"compile": "default"},
        "a fraction of max-autotune's compile time, most of its speed",
        "max-autotune benchmarks kernel choices at compile time: long compiles for a short run",
    )
    eager = Recommendation(
        "Run this job eagerly",
        {"compile": "off"},
        "no compile to pay: the whole run at the eager step time",
        f"compiling pays back only past {steps:,.0f} steps" if steps is not None else "compiling is not faster here",
    )
    return [shorter, eager] if ev.ctx.config.compile == "max-autotune" else [eager]


def notes(ev: Evidence) -> list[str]:
    if ev.ctx.config.compile != "off" and ev.baseline is None:
        return ["compile payback: not judged without an uncompiled baseline (diagnose(result, baseline=eager_result))"]
    return []


DETECTOR = Detector(
    name="compile-payback",
    reads="a compiled trial's compile time and median step against an uncompiled baseline's, and the planned steps",
    find=find,
    notes=notes,
)
