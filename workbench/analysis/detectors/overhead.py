"""Host/launch-overhead bound: the step's time goes to launching work rather than doing it.

Reads the profiled window's overhead figures: on CPU the framework-overhead share of the compute
phases (time not spent doing an op's work), on CUDA the GPU's idle share between kernels. The fixes
make fewer, bigger launches: foreach optimizers, bigger batches, compile, CUDA graphs.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding

#: CPU: share of compute-phase time that is framework overhead rather than op work.
HOST_OVERHEAD_SHARE = 0.5
#: CUDA: share of the window the GPU idles between kernels.
DEVICE_IDLE_SHARE = 0.4


def find(ev: Evidence) -> list[Finding]:
    ctx, profile = ev.ctx, ev.profile
    overhead = profile.get("overhead") or {}
    optimizer_share = profile.get("phase_share", {}).get("optimizer", 0.0)
    ops = float(profile.get("ops_per_step") or 0.0)
    evidence: dict[str, Any]
    if ctx.device_type == "cuda":
        idle = overhead.get("device_idle_share")
        if idle is None or idle < DEVICE_IDLE_SHARE:
            return []
        share = float(idle)
        evidence = {
            "device_idle_share": idle,
            "kernels_per_step": overhead.get("kernels_per_step"),
            "median_kernel_us": overhead.get("median_kernel_us"),
            "short_kernel_share": overhead.get("short_kernel_share"),
        }
        detail = (
            f"the GPU sits idle {idle:.0%} of the profiled window; {overhead.get('kernels_per_step', 0):.0f} kernels "
            f"per step, median {overhead.get('median_kernel_us') or 0:.1f} µs"
        )
    else:
        framework = overhead.get("framework_overhead_share")
        if framework is None or framework < HOST_OVERHEAD_SHARE:
            return []
        share = float(framework)
        evidence = {
            "framework_overhead_share": framework,
            "ops_per_step": ops,
            "median_op_self_us": overhead.get("median_op_self_us"),
            "op_floor_us": overhead.get("op_floor_us"),
            "optimizer_phase_share": optimizer_share,
        }
        detail = (
            f"{framework:.0%} of forward/backward/optimizer time is framework overhead (dispatch, autograd, Python), "
            f"not op work: {ops:.0f} ops per step, median {overhead.get('median_op_self_us') or 0:.1f} µs each"
        )
    finding = Finding(
        kind="overhead",
        severity="bottleneck",
        title="Host / launch-overhead bound",
        summary=detail,
        evidence=evidence,
        score=share * (1.0 - ev.data_share),
        recommendations=for_overhead(ctx, optimizer_share),
    )
    return [finding]


def for_overhead(ctx: Context, optimizer_share: float) -> list[Recommendation]:
    bigger = ctx.batch_size * 4 if ctx.batch_size else None
    batch = Recommendation(
        f"Raise the batch size to {bigger}",
        {"batch_size": bigger} if bigger else {},
        "per-sample time falls while fixed per-op costs dominate (up to ≈4× the throughput); "
        "check the memory first with `workbench estimate`",
        "the cost of launching an op barely depends on its size, so bigger ops amortize it",
    )
    foreach = Recommendation(
        "Batch the optimizer's per-parameter ops",
        {"optimizer_impl": "foreach"},
        f"the optimizer takes {optimizer_share:.0%} of the step; foreach runs it as a few multi-tensor "
        "ops instead of ~10 ops per parameter",
        "a for-loop optimizer launches one small op per parameter and per update term",
    )
    graphs = _cuda_graphs_or_its_blocker(ctx.sync_sites)
    reduce = Recommendation(
        "Compile with mode=reduce-overhead",
        {"compile": "reduce-overhead"},
        "fuses ops and replays them as CUDA graphs",
        "fewer, larger kernels and no per-kernel launch",
    )
    fuse = Recommendation(
        "Compile the model",
        {"compile": "default"},
        "fuses chains of small ops into a few kernels (first step pays the compile, minutes on CPU)",
        "fewer ops means fewer dispatches through Python and the dispatcher",
    )
    if ctx.device_type == "cuda":
        order = [graphs, reduce, foreach, batch, fuse]
    else:
        order = [foreach, batch, fuse] if optimizer_share >= 0.2 else [batch, fuse, foreach]
    if optimizer_share < 0.1 or (ctx.optimizer_impl or ctx.config.optimizer_impl) != "for-loop":
        order = [r for r in order if r is not foreach]
    if bigger is None:
        order = [r for r in order if r is not batch]
    return ctx.offer(order)


def _cuda_graphs_or_its_blocker(sync_sites: list[dict[str, Any]]) -> Recommendation:
    """CUDA graphs when the step is capturable; else the sync that makes capture fail, to remove first.

    A host sync inside `torch.cuda.graph(...)` fails the capture ("operation not permitted when
    stream is capturing"), so cuda_graphs=true would only turn the trial into an error.
    """
    if not sync_sites:
        return Recommendation(
            "Capture the step in a CUDA graph",
            {"cuda_graphs": True},
            "launch cost drops to one graph launch per step; the GPU no longer waits between kernels",
            "the CPU cannot launch small kernels as fast as the GPU runs them",
        )
    first = max(sync_sites, key=lambda site: site.get("count", 0))
    what = first.get("code") or first.get("op", "a host read")
    via = f" (via {first['via']})" if first.get("via") else ""
    if "grad_scaler" in str(first.get("via", "")):
        via += ", fp16's GradScaler inf check: amp=bf16 needs none"
    others = f", and {len(sync_sites) - 1} other sync site(s)" if len(sync_sites) > 1 else ""
    return Recommendation(
        f"Remove the host sync at {first.get('source', '?')} first, then capture the step in a CUDA graph",
        {},
        "once the step never waits for the device it can be captured: one graph launch per step",
        f"`{what}`{via} makes the host wait for the device ({first.get('op', 'sync')}){others}; "
        "a sync cannot be captured, so cuda_graphs=true would fail at capture until it is gone",
    )


DETECTOR = Detector(
    name="overhead",
    reads="the profiled window's overhead: framework-overhead share (CPU) or GPU idle share (CUDA)",
    find=find,
)
