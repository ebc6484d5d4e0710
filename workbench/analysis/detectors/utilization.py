"""Utilization: what the timed window's utilization (`TrialResult.utilization`) says of the step.

Two readings the phase times alone cannot give: on CUDA, a GPU that NVML saw busy only part
of the window while steps are short is launch- or data-bound (the host cannot feed it); on
CPU, a trial that ran on far fewer cores than it may use while other processes kept the host
busy was slowed by them (contention: an 'info' caveat on the measurement, not the configuration). Each adds evidence to the
finding the profile already made, or is a finding of its own where the profile made none.
It runs after the data, overhead and rank detectors, whose findings it corroborates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector
from workbench.analysis.detectors.data import for_data
from workbench.analysis.detectors.overhead import for_overhead
from workbench.analysis.detectors.threads import for_threads
from workbench.analysis.findings import Finding, Kind

if TYPE_CHECKING:
    from workbench.measure.result import TrialResult

#: CUDA: median NVML utilization below which the GPU waited on the host much of the window.
LOW_GPU_UTIL_PCT = 60.0
#: A step this short (ms) is where launch and loading costs, not kernels, can set the pace.
SHORT_STEP_MS = 50.0
#: CPU: the trial used less than this share of the cores it could have kept busy ...
CONTENDED_SHARE = 0.6
#: ... while other processes kept at least this many cores busy.
OTHER_BUSY_CORES = 0.5
#: Data phase share from which an under-used GPU is read as waiting for batches rather than launches.
DATA_WAIT_SHARE = 0.1


def utilization_findings(ctx: Context, result: TrialResult, findings: list[Finding]) -> list[Finding]:
    """New findings from the window's utilization; evidence for existing ones is added to them in place."""
    util = result.utilization or {}
    cpu = _without_other_ranks(util.get("cpu"), (result.distributed or {}).get("host_load"))
    found = [_gpu_underused(ctx, util.get("gpu"), findings), _cpu_contention(ctx, cpu)]
    return [f for f in found if f is not None]


def _without_other_ranks(cpu: dict[str, Any] | None, hosts: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Rank 0's CPU figures with the other ranks on its host no longer counted as 'other processes'."""
    if not cpu or not hosts:
        return cpu
    own_host = hosts[0]  # listed in rank order: rank 0's host first
    return {**cpu, "other_cores": max(0.0, float(cpu["host_busy_cores"]) - own_host["ranks_cores"])}


def utilization_notes(result: TrialResult) -> list[str]:
    """Why the GPU's utilization could not be judged (a window too short for NVML's sampling), if so."""
    gpu = (result.utilization or {}).get("gpu") or {}
    reason = gpu.get("util_reason") or ""
    return [f"GPU utilization not judged: {reason}"] if reason and gpu.get("util_pct") is None else []


def _gpu_underused(ctx: Context, gpu: dict[str, Any] | None, findings: list[Finding]) -> Finding | None:
    busy = ((gpu or {}).get("util_pct") or {}).get("median")
    if ctx.device_type != "cuda" or busy is None or busy >= LOW_GPU_UTIL_PCT or ctx.step_ms >= SHORT_STEP_MS:
        return None
    data_share = ctx.phase_ms.get("data", 0.0) / ctx.step_ms if ctx.step_ms else 0.0
    waiting_for = "batches" if data_share >= DATA_WAIT_SHARE else "kernel launches"
    sentence = (
        f"NVML saw the GPU busy a median {busy:.0f}% of the timed window with {ctx.step_ms:.1f} ms steps: "
        f"it waits on the host ({waiting_for})"
    )
    evidence = {"gpu_util_pct": busy, "step_ms": ctx.step_ms, "data_share": data_share}
    kind: Kind = "data" if waiting_for == "batches" else "overhead"
    existing = next((f for f in findings if f.kind == kind), None)
    if existing is not None:  # the profile or the phases already said so: this corroborates it
        existing.summary += f"; {sentence}"
        existing.evidence.update(evidence)
        return None
    recs = for_data(ctx, ctx.phase_ms.get("data", 0.0)) if kind == "data" else for_overhead(ctx, 0.0)
    return Finding(
        kind=kind,
        severity="bottleneck",
        title="GPU under-used: host-bound",
        summary=sentence,
        evidence=evidence,
        score=1.0 - busy / 100.0,
        recommendations=recs,
    )


def _cpu_contention(ctx: Context, cpu: dict[str, Any] | None) -> Finding | None:
    if ctx.device_type != "cpu" or not cpu:
        return None
    threads = int(cpu.get("torch_threads") or cpu["cores_available"]) + ctx.config.num_workers
    could_use = min(threads, int(cpu["cores_available"]))
    used, others = float(cpu["cores_used"]), float(cpu["other_cores"])
    if used >= CONTENDED_SHARE * could_use or others < OTHER_BUSY_CORES:
        return None
    free = max(1, round(cpu["cores_available"] - others))
    recs = [
        Recommendation(
            "Measure on a quiet machine (or stop the other work)",
            {},
            f"the trial gets its {could_use} core(s) back: faster and far steadier steps",
            f"other processes used {others:.1f} cores while this trial was timed",
            rank=1,
        )
    ]
    if ctx.config.intra_op_threads is None or ctx.config.intra_op_threads > free:
        for rec in for_threads(ctx, free, threads):
            rec.rank = len(recs) + 1
            recs.append(rec)
    return Finding(
        kind="threads",
        severity="info",  # a caveat on the measurement, not something the configuration does
        title="CPU contention: other processes took the cores",
        summary=f"the trial ran on {used:.2f} of the {could_use} core(s) it could use while other processes kept "
        f"{others:.2f} core(s) busy (host {cpu['host_pct']:.0f}% busy): its step times are inflated by them",
        evidence={
            "cores_used": used,
            "cores_it_could_use": could_use,
            "other_cores": others,
            "host_pct": cpu["host_pct"],
            "unused_share": 1.0 - used / could_use,
        },
        score=0.0,  # listed after the findings about the step itself
        recommendations=recs,
    )


DETECTOR = Detector(
    name="utilization",
    reads="the timed window's CPU and GPU utilization (cores used, other processes, NVML busy share)",
    find=lambda ev: utilization_findings(ev.ctx, ev.result, ev.findings),
    notes=lambda ev: utilization_notes(ev.result),
)
