"""Why is this step slow? Findings with evidence and ranked recommendations, from one trial's result.

Pure functions over a `TrialResult` (its timed phases, memory and profiled window) plus an
optional FLOP count. Each detector reads robust evidence — shares of the step and counts,
never a single absolute timing — because steps on a shared machine are noisy:

- data-loading bound: the timed window's data phase share (the profiler never touches it);
- host/launch-overhead bound: on CPU the framework-overhead share of the compute phases
  (time not spent doing an op's work), on CUDA the GPU's idle share between kernels;
- synchronization stalls: host-synchronizing calls per step, with their source lines;
- memory-bandwidth vs compute: the kernel-time mix (matmul/conv/attention vs the rest), and
  MFU where the device has a peak in the table;
- memory: the peak against the device's memory;
- CPU oversubscription: intra-op threads x processes (ranks, loader workers) above the cores;
- the timed window's utilization (`diagnose_utilization`): an under-used GPU with short steps is
  host-bound, a CPU trial on few of its cores beside busy other processes is contention.

A finding is a 'bottleneck' (something to fix) or 'info' (a compute-bound step is where a
well-balanced step should be; its recommendations make the compute itself faster).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.analysis import recommend
from workbench.analysis.diagnose_utilization import utilization_findings, utilization_notes
from workbench.analysis.findings import Finding as Finding  # re-exported: callers import it from here
from workbench.analysis.findings import Kind as Kind
from workbench.analysis.findings import Severity as Severity
from workbench.analysis.flops import FlopCount, Mfu, model_flops_utilization
from workbench.analysis.ranks import distributed_findings, distributed_notes
from workbench.config import TrainConfig, resolved_optimizer_impl
from workbench.measure.result import TrialResult

#: Data phase share of the step above which loading is the bottleneck (a quarter of every step idle).
DATA_SHARE = 0.25
#: CPU: share of compute-phase time that is framework overhead rather than op work.
HOST_OVERHEAD_SHARE = 0.5
#: CUDA: share of the window the GPU idles between kernels.
DEVICE_IDLE_SHARE = 0.4
#: Kernel-mix thresholds, applied only when kernels fill at least KERNEL_BOUND of the compute phases.
KERNEL_BOUND = 0.5
COMPUTE_HEAVY_SHARE = 0.5
MEMORY_BOUND_SHARE = 0.6
#: MFU above which a GPU step is compute-bound whatever the kernel mix.
HIGH_MFU = 0.4
#: Peak memory share of the device above which memory is the constraint.
MEMORY_SHARE = 0.85


@dataclass
class Diagnosis:
    trial_id: str
    findings: list[Finding]
    """Bottlenecks first, each group by score."""
    mfu: Mfu | None
    notes: list[str] = field(default_factory=list)

    @property
    def bottlenecks(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "bottleneck"]

    @property
    def primary(self) -> Finding | None:
        """The finding that explains most of the step."""
        return self.findings[0] if self.findings else None

    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def to_text(self, result: TrialResult | None = None) -> str:
        """Plain text for the terminal: findings, then (with the result) top operators and memory."""
        from workbench.textfmt import format_bytes, table

        lines = ["Diagnosis" + (f" — primary: {self.primary.title}" if self.primary else " — no bottleneck found")]
        for finding in self.findings:
            lines.append(f"\n[{finding.severity}] {finding.title}: {finding.summary}")
            for rec in finding.recommendations:
                change = ", ".join(f"{k}={v}" for k, v in rec.changes.items()) or "code change"
                lines.append(f"  {rec.rank}. {rec.title} [{change}] — {rec.expected}. Why: {rec.why}")
        if self.mfu is not None and self.mfu.mfu is not None:
            lines.append(f"\nMFU {self.mfu.mfu:.1%} ({self.mfu.peak_source})")
        lines += [f"note: {note}" for note in self.notes]
        if result is not None and result.median_step_ms:
            step = result.median_step_ms
            phases = ", ".join(f"{k} {v:.1f} ms ({v / step:.0%})" for k, v in result.phase_medians_ms().items())
            lines.append(f"\ntimed window: median step {step:.1f} ms; {phases}")
        profile = (result.profile if result is not None else None) or {}
        if profile.get("top_ops"):
            rows = [[r["name"][:48], f"{r['calls_per_step']:g}", f"{r['self_ms_per_step']:.2f}", f"{r['self_share']:.0%}",
                     r["input_shapes"][:50]] for r in profile["top_ops"][:10]]  # fmt: skip
            lines += ["", table(["top operators", "calls/step", "self ms/step", "share", "input shapes"], rows)]
        if profile.get("trace_path"):
            lines.append(
                f"trace: {profile['trace_path']} ({format_bytes(profile['trace_bytes'])}) {profile['trace_note']}"
            )
        if result is not None and result.memory_breakdown:
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in result.memory_breakdown.items() if v)
            lines.append(f"memory at peak: {parts}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "primary": self.primary.kind if self.primary else None,
            "findings": [f.to_dict() for f in self.findings],
            "mfu": asdict(self.mfu) if self.mfu else None,
            "notes": list(self.notes),
        }


def diagnose(result: TrialResult, flops: FlopCount | int | None = None) -> Diagnosis:
    """Findings for one finished trial; `flops` (per step) enables MFU."""
    notes: list[str] = []
    if not result.ok or not result.step_ms:
        return Diagnosis(result.trial_id, [], None, [f"trial status {result.status}: nothing to diagnose"])
    ctx = _context(result)
    total_flops = flops.total if isinstance(flops, FlopCount) else flops
    mfu = model_flops_utilization(total_flops, result.median_step_ms, ctx_device_name(result), result.config)
    if mfu.peak_flops is None:
        notes.append(f"MFU not available: {mfu.peak_source}")
    profile = result.profile or {}
    if not profile:
        notes.append("no profiled window (run with profile=True): only the data and memory checks ran")
    phases = result.phase_medians_ms()
    findings = [
        _data(ctx, phases),
        _overhead(ctx, profile, phases),
        _syncs(ctx, profile),
        _memory(ctx, result),
        _oversubscribed(ctx, result),
        *_kernels(ctx, profile, mfu, phases),
        *distributed_findings(result),
    ]
    kept = _one_rank_data_finding(f for f in findings if f is not None)
    kept += utilization_findings(ctx, result, kept)
    notes += utilization_notes(result)
    notes += distributed_notes(result)
    kept.sort(key=lambda f: (f.severity != "bottleneck", -f.score))
    if profile.get("syncs", {}).get("error"):
        notes.append(f"sync scan failed: {profile['syncs']['error']}")
    return Diagnosis(result.trial_id, kept, mfu, notes)


def _one_rank_data_finding(findings: Iterable[Finding]) -> list[Finding]:
    """A straggler late because of its data loading carries the data advice for that rank: rank 0's own
    data-bound finding (the phases are rank 0's) would say it again without naming the rank."""
    kept = list(findings)
    if any(f.kind == "distributed" and f.evidence.get("cause") == "data" for f in kept):
        kept = [f for f in kept if f.kind != "data"]
    return kept


def ctx_device_name(result: TrialResult) -> str:
    return str(result.device.get("name", "cpu")) if result.device.get("type") == "cuda" else "cpu"


def _context(result: TrialResult) -> recommend.Context:
    return recommend.Context(
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


# --- detectors -------------------------------------------------------------------------------


def _data(ctx: recommend.Context, phases: dict[str, float]) -> Finding | None:
    data_ms = phases.get("data", 0.0)
    share = data_ms / ctx.step_ms if ctx.step_ms else 0.0
    if share < DATA_SHARE:
        return None
    return Finding(
        kind="data",
        severity="bottleneck",
        title="Data loading bound",
        summary=f"the step waits {data_ms:.1f} ms of its {ctx.step_ms:.1f} ms median ({share:.0%}) for the next "
        f"batch, with num_workers={ctx.config.num_workers}",
        evidence={
            "data_ms": data_ms,
            "step_ms": ctx.step_ms,
            "data_share": share,
            "num_workers": ctx.config.num_workers,
        },
        score=share,
        recommendations=recommend.for_data(ctx, data_ms),
    )


def _overhead(ctx: recommend.Context, profile: dict[str, Any], phases: dict[str, float]) -> Finding | None:
    overhead = profile.get("overhead") or {}
    data_share = phases.get("data", 0.0) / ctx.step_ms if ctx.step_ms else 0.0
    optimizer_share = profile.get("phase_share", {}).get("optimizer", 0.0)
    ops = float(profile.get("ops_per_step") or 0.0)
    if ctx.device_type == "cuda":
        idle = overhead.get("device_idle_share")
        if idle is None or idle < DEVICE_IDLE_SHARE:
            return None
        share = float(idle)
        evidence = {"device_idle_share": idle, "kernels_per_step": overhead.get("kernels_per_step"),
                    "median_kernel_us": overhead.get("median_kernel_us"),
                    "short_kernel_share": overhead.get("short_kernel_share")}  # fmt: skip
        detail = (
            f"the GPU sits idle {idle:.0%} of the profiled window; {overhead.get('kernels_per_step', 0):.0f} kernels "
            f"per step, median {overhead.get('median_kernel_us') or 0:.1f} µs"
        )
    else:
        framework = overhead.get("framework_overhead_share")
        if framework is None or framework < HOST_OVERHEAD_SHARE:
            return None
        share = float(framework)
        evidence = {"framework_overhead_share": framework, "ops_per_step": ops,
                    "median_op_self_us": overhead.get("median_op_self_us"), "op_floor_us": overhead.get("op_floor_us"),
                    "optimizer_phase_share": optimizer_share}  # fmt: skip
        detail = (
            f"{framework:.0%} of forward/backward/optimizer time is framework overhead (dispatch, autograd, Python), "
            f"not op work: {ops:.0f} ops per step, median {overhead.get('median_op_self_us') or 0:.1f} µs each"
        )
    return Finding(
        kind="overhead",
        severity="bottleneck",
        title="Host / launch-overhead bound",
        summary=detail,
        evidence=evidence,
        score=share * (1.0 - data_share),
        recommendations=recommend.for_overhead(ctx, optimizer_share),
    )


def _syncs(ctx: recommend.Context, profile: dict[str, Any]) -> Finding | None:
    syncs = profile.get("syncs") or {}
    per_step = syncs.get("per_step")
    if not per_step or per_step < 1:
        return None
    sites = list(syncs.get("sites") or [])
    where = "; ".join(f"{s['count']:g}× {s['op']} at {s['source']}" for s in sites[:3])
    cost = (
        "each one stalls the launch queue until the GPU catches up"
        if ctx.device_type == "cuda"
        else "on this CPU they cost nothing, but on a GPU each one stalls the launch queue"
    )
    return Finding(
        kind="sync",
        severity="bottleneck",
        title="Host-device synchronization",
        summary=f"{per_step:g} host-synchronizing call(s) per step ({where}); {cost}, and they rule out CUDA graphs",
        evidence={"syncs_per_step": per_step, "sites": sites},
        score=0.5 if ctx.device_type == "cuda" else 0.1,
        recommendations=recommend.for_syncs(ctx, sites),
    )


def _kernels(ctx: recommend.Context, profile: dict[str, Any], mfu: Mfu, phases: dict[str, float]) -> list[Finding]:
    """Compute-bound or memory-bandwidth-bound, from the kernel mix, when kernels fill the step."""
    mix = profile.get("kernel_mix") or {}
    overhead = profile.get("overhead") or {}
    if not mix:
        return []
    idle_key = "device_idle_share" if ctx.device_type == "cuda" else "framework_overhead_share"
    busy_share = 1.0 - float(overhead.get(idle_key) or 0.0)
    data_share = phases.get("data", 0.0) / ctx.step_ms if ctx.step_ms else 0.0
    heavy, conv, light = mix.get("compute_heavy", 0.0), mix.get("conv", 0.0), mix.get("memory_bound", 0.0)
    evidence = {"kernel_busy_share": busy_share, "compute_heavy_share": heavy, "conv_share": conv,
                "memory_bound_share": light, "mfu": mfu.mfu, "achieved_tflops": (mfu.achieved_flops or 0) / 1e12}  # fmt: skip
    mfu_text = f"MFU {mfu.mfu:.0%} of {mfu.peak_source}" if mfu.mfu is not None else f"MFU n/a ({mfu.peak_source})"
    if mfu.achieved_flops:
        mfu_text += f"; achieved {mfu.achieved_flops / 1e9:.1f} GFLOP/s"
    if busy_share < KERNEL_BOUND:
        return []
    score = busy_share * (1.0 - data_share)
    if heavy >= COMPUTE_HEAVY_SHARE or (mfu.mfu is not None and mfu.mfu >= HIGH_MFU):
        return [Finding(
            kind="compute", severity="info", title="Compute bound",
            summary=f"{heavy:.0%} of kernel time is matmul/conv/attention arithmetic ({conv:.0%} convolutions); {mfu_text}",
            evidence=evidence, score=score * heavy,
            recommendations=recommend.for_compute(ctx, conv, mfu.mfu),
        )]  # fmt: skip
    if light >= MEMORY_BOUND_SHARE and (mfu.mfu is None or mfu.mfu < HIGH_MFU):
        return [Finding(
            kind="memory-bandwidth", severity="bottleneck", title="Memory-bandwidth bound",
            summary=f"{light:.0%} of kernel time is element-wise, normalization, copy and optimizer ops, "
            f"limited by memory traffic rather than arithmetic; {mfu_text}",
            evidence=evidence, score=score * light,
            recommendations=recommend.for_bandwidth(ctx, conv),
        )]  # fmt: skip
    return []


def _memory(ctx: recommend.Context, result: TrialResult) -> Finding | None:
    total = result.device.get("total_memory_bytes")
    peak = result.peak_memory_bytes
    if not total or not peak or peak / total < MEMORY_SHARE:
        return None
    share = peak / total
    largest = sorted((result.memory_breakdown or {}).items(), key=lambda kv: -kv[1])[:2]
    parts = ", ".join(f"{name} {value / 2**30:.1f} GiB" for name, value in largest)
    return Finding(
        kind="memory",
        severity="bottleneck",
        title="Memory bound",
        summary=f"peak {peak / 2**30:.1f} GiB is {share:.0%} of the device's {total / 2**30:.0f} GiB ({parts})",
        evidence={"peak_bytes": peak, "device_bytes": total, "share": share, "breakdown": result.memory_breakdown},
        score=share - MEMORY_SHARE,
        recommendations=recommend.for_memory(ctx),
    )


def _oversubscribed(ctx: recommend.Context, result: TrialResult) -> Finding | None:
    """More runnable threads than cores: every operator's threads wait for the slowest one, and
    step times swing with whatever else runs (57 ms to 2.4 s for one ViT step seen on 2 cores)."""
    from workbench.levers.threads import resolved_intra_op_threads

    threads = resolved_intra_op_threads(result.applied)
    if threads is None:
        return None
    processes = ctx.config.nproc_per_node if ctx.config.strategy != "none" else 1  # ranks sharing this host
    loaders = ctx.config.num_workers * processes  # PyTorch runs each loader worker on one thread
    demand = threads * processes + loaders
    if demand <= ctx.cpu_cores:
        return None
    fit = max(1, ctx.cpu_cores // processes - ctx.config.num_workers)
    return Finding(
        kind="threads",
        severity="bottleneck" if ctx.device_type == "cpu" else "info",
        title="CPU oversubscribed",
        summary=f"{threads} intra-op thread(s) x {processes} process(es) + {loaders} loader worker(s) = {demand} "
        f"busy threads on {ctx.cpu_cores} core(s)",
        evidence={
            "intra_op_threads": threads,
            "processes": processes,
            "loader_workers": loaders,
            "cpu_cores": ctx.cpu_cores,
        },
        score=0.5 * (1.0 - ctx.cpu_cores / demand),
        recommendations=recommend.for_threads(ctx, fit, demand),
    )


def diagnose_trial(result: TrialResult, workload: Any = None) -> Diagnosis:
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
        except (
            Exception
        ) as exc:  # FLOPs are evidence for MFU only; a model that fake tensors cannot run still gets a diagnosis
            note = f"FLOPs not counted: {type(exc).__name__}: {exc}"
    diagnosis = diagnose(result, flops)
    if note:
        diagnosis.notes.append(note)
    elif flops is None and result.ok:
        diagnosis.notes.append("FLOPs not counted: pass the workload (a notebook object cannot be rebuilt by name)")
    return diagnosis
