"""Why is this step slow? `diagnose` runs every registered detector over one trial's result.

Pure functions over a `TrialResult` (its timed phases, memory, utilization, profiled window, the
per-rank figures of a distributed trial) plus an optional FLOP count for MFU. Each detector is one
module of `analysis.detectors` (what it reads, its finding, its recommendations), listed in
`detectors.registry.DETECTORS`; this module builds the evidence they share and orders what they
found. Detectors read robust evidence — shares of the step and counts, never a single absolute
timing — because steps on a shared machine are noisy.

A finding is a 'bottleneck' (something to fix) or 'info' (a compute-bound step is where a
well-balanced step should be; its recommendations make the compute itself faster).
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.advice import Context
from workbench.analysis.compare import DEFAULT_PLANNED_STEPS
from workbench.analysis.detectors.base import Evidence
from workbench.analysis.detectors.data import DATA_SHARE as DATA_SHARE  # re-exported: the thresholds lived here
from workbench.analysis.detectors.kernels import COMPUTE_HEAVY_SHARE as COMPUTE_HEAVY_SHARE
from workbench.analysis.detectors.kernels import HIGH_MFU as HIGH_MFU
from workbench.analysis.detectors.kernels import KERNEL_BOUND as KERNEL_BOUND
from workbench.analysis.detectors.kernels import MEMORY_BOUND_SHARE as MEMORY_BOUND_SHARE
from workbench.analysis.detectors.memory import MEMORY_SHARE as MEMORY_SHARE
from workbench.analysis.detectors.overhead import DEVICE_IDLE_SHARE as DEVICE_IDLE_SHARE
from workbench.analysis.detectors.overhead import HOST_OVERHEAD_SHARE as HOST_OVERHEAD_SHARE
from workbench.analysis.detectors.registry import DETECTORS
from workbench.analysis.diagnosis import Diagnosis as Diagnosis  # re-exported: callers import it from here
from workbench.analysis.findings import Finding as Finding
from workbench.analysis.findings import Kind as Kind
from workbench.analysis.findings import Severity as Severity
from workbench.analysis.flops import FlopCount, model_flops_utilization
from workbench.config import TrainConfig, resolved_optimizer_impl
from workbench.measure.result import TrialResult


def diagnose(
    result: TrialResult,
    flops: FlopCount | int | None = None,
    *,
    baseline: TrialResult | None = None,
    planned_steps: int = DEFAULT_PLANNED_STEPS,
) -> Diagnosis:
    """Findings for one finished trial; `flops` (per step) enables MFU; an uncompiled `baseline` of the
    same workload and the run's `planned_steps` let a compiled trial's compile time be judged."""
    _check_payback_inputs(baseline, planned_steps)
    if not result.ok or not result.step_ms:
        return Diagnosis(result.trial_id, [], None, [f"trial status {result.status}: nothing to diagnose"])
    ctx = _context(result)
    total_flops = flops.total if isinstance(flops, FlopCount) else flops
    mfu = model_flops_utilization(total_flops, result.median_step_ms, ctx_device_name(result), result.config)
    notes: list[str] = []
    if mfu.peak_flops is None:
        notes.append(f"MFU not available: {mfu.peak_source}")
    profile = result.profile or {}
    if not profile:
        notes.append("no profiled window (run with profile=True): only the data and memory checks ran")
    ev = Evidence(result, ctx, profile, result.phase_medians_ms(), mfu, baseline=baseline, planned_steps=planned_steps)
    for item in DETECTORS:
        ev.findings.extend(item.find(ev))
    for item in DETECTORS:
        notes += item.notes(ev) if item.notes is not None else []
    findings = sorted(ev.findings, key=lambda f: (f.severity != "bottleneck", -f.score))
    return Diagnosis(result.trial_id, findings, mfu, notes)


def _check_payback_inputs(baseline: Any, planned_steps: Any) -> None:
    if baseline is not None and not isinstance(baseline, TrialResult):
        raise TypeError(f"baseline must be a TrialResult (an uncompiled trial of the same workload), got {baseline!r}")
    if isinstance(planned_steps, bool) or not isinstance(planned_steps, int) or planned_steps < 1:
        raise ValueError(f"planned_steps must be a whole number >= 1 (steps of your real run), got {planned_steps!r}")


def ctx_device_name(result: TrialResult) -> str:
    return str(result.device.get("name", "cpu")) if result.device.get("type") == "cuda" else "cpu"


def _context(result: TrialResult) -> Context:
    return Context(
        config=TrainConfig.from_dict(result.config),
        device_type=str(result.device.get("type", "cpu")),
        cpu_cores=int(result.device.get("cpu_cores") or 1),
        capabilities=result.capabilities or {},
        step_ms=float(result.median_step_ms or 0.0),
        phase_ms=result.phase_medians_ms(),
        batch_size=result.batch_size,
        optimizer_impl=resolved_optimizer_impl(result.applied) or "",
        sync_sites=list(((result.profile or {}).get("syncs") or {}).get("sites") or []),
    )


def diagnose_trial(
    result: TrialResult,
    workload: Any = None,
    *,
    baseline: TrialResult | None = None,
    planned_steps: int = DEFAULT_PLANNED_STEPS,
) -> Diagnosis:
    """`diagnose` with the FLOPs counted for you (fake tensors, seconds), from `workload` or the
    result's own workload source (built-ins and 'module:attr' specs rebuild by name)."""
    from workbench.analysis.flops import step_flops

    flops: FlopCount | None = None
    note = ""
    source = result.workload_source or {}
    target = workload if workload is not None else source.get("name")
    if result.ok and target is not None:
        try:
            if isinstance(target, str):
                from workbench.workloads import load_workload

                target = load_workload(target, preset=source.get("preset") or "tiny", **source.get("options", {}))
            flops = step_flops(target, TrainConfig.from_dict(result.config))
        # FLOPs are evidence for MFU only: a model that fake tensors cannot run still gets a diagnosis.
        except Exception as exc:
            note = f"FLOPs not counted: {type(exc).__name__}: {exc}"
    diagnosis = diagnose(result, flops, baseline=baseline, planned_steps=planned_steps)
    if note:
        diagnosis.notes.append(note)
    elif flops is None and result.ok:
        diagnosis.notes.append("FLOPs not counted: pass the workload (a notebook object cannot be rebuilt by name)")
    return diagnosis
