"""Data-loading bound: the timed window's data phase share of the step (the profiler never touches it).

Reads `TrialResult.phase_ms['data']`; a quarter of every step spent waiting for the next batch is
the bottleneck, and loader workers (as many as hide loading behind compute) are the fix. Where the
ideal-loader bound was measured beside the trial (`compare --ideal-loader`, `wb.loader_bound`), the
finding quotes it: the headroom any loader change has, with its interval.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding
from workbench.analysis.loader_bound import LoaderBound
from workbench.analysis.workers import workers_needed

#: Data phase share of the step above which loading is the bottleneck (a quarter of every step idle).
DATA_SHARE = 0.25


def find(ev: Evidence) -> list[Finding]:
    ctx = ev.ctx
    data_ms = ev.phases.get("data", 0.0)
    share = data_ms / ctx.step_ms if ctx.step_ms else 0.0
    if share < DATA_SHARE:
        return []
    bound = measured_bound(ev)
    headroom = f"; measured against batches staged on the device, {bound.sentence()}" if bound is not None else ""
    evidence: dict[str, Any] = {
        "data_ms": data_ms,
        "step_ms": ctx.step_ms,
        "data_share": share,
        "num_workers": ctx.config.num_workers,
    }
    if bound is not None:
        evidence["loader_bound"] = bound.to_dict()
    return [
        Finding(
            kind="data",
            severity="bottleneck",
            title="Data loading bound",
            summary=f"the step waits {data_ms:.1f} ms of its {ctx.step_ms:.1f} ms median ({share:.0%}) for the next "
            f"batch, with num_workers={ctx.config.num_workers}{headroom}",
            evidence=evidence,
            score=share,
            recommendations=for_data(ctx, data_ms, bound),
        )
    ]


def measured_bound(ev: Evidence) -> LoaderBound | None:
    """The ideal-loader bound the comparison attached to this trial, if one was measured."""
    figures = ev.result.comparison or {}
    data = figures.get("loader_bound") if isinstance(figures, dict) else None
    return LoaderBound.from_dict(data) if data else None


def for_data(ctx: Context, data_ms: float, bound: LoaderBound | None = None) -> list[Recommendation]:
    compute_ms = max(ctx.step_ms - data_ms, 1e-3)
    if bound is not None and bound.ideal_step_ms is not None:
        compute_ms = bound.ideal_step_ms  # measured: the step with nothing to wait for
    # Enough workers to hide loading behind compute, no more than there are cores (or 8).
    workers = workers_needed(data_ms, compute_ms, min(max(1, ctx.cpu_cores), 8)).workers
    new_step = max(compute_ms, data_ms / workers)
    caveat = ", less where they share the CPU with the compute (a CPU trial)" if ctx.device_type == "cpu" else ""
    recs = [
        Recommendation(
            f"Load batches in {workers} worker process(es)",
            {"num_workers": workers, "persistent_workers": True},
            f"step ≈ max(compute {compute_ms:.0f} ms, data {data_ms:.0f} ms ÷ {workers}) ≈ {new_step:.0f} ms "
            f"(≈{ctx.step_ms / new_step:.1f}× faster){caveat}",
            "with num_workers=0 the training loop waits while each batch is decoded; workers prepare the "
            "next batches while the model computes",
        ),
        Recommendation(
            "Pin host memory for the batches",
            {"pin_memory": True, "num_workers": max(ctx.config.num_workers, workers)},
            "host→GPU copies become asynchronous and about twice as fast",
            "pageable memory is staged through a pinned buffer by the driver, synchronously",
        ),
        Recommendation(
            "Prefetch more batches per worker",
            {"num_workers": max(ctx.config.num_workers, workers), "prefetch_factor": 4},
            "absorbs slow batches (variable decode cost); no gain when loading is uniformly slow",
            "each worker keeps 4 batches ready instead of 2",
        ),
    ]
    return ctx.offer(recs)


DETECTOR = Detector(
    name="data",
    reads="the timed window's data phase (TrialResult.phase_ms['data']) against the median step",
    find=find,
)
