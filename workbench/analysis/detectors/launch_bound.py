"""Launch-bound compiled step: compiled, and still more launching than doing.

Reads the profiled window of a compiled trial: launches per step (device kernels on CUDA, leaf op
calls on CPU), the median work of one launch, the same step's eager launches, and the overhead
figures the overhead detector judged. Compile fuses ops but each remaining kernel is still one
launch; when the device idles between them, the fix is fewer launches per step, not faster kernels:
CUDA graphs (`compile=reduce-overhead`, or `cuda_graphs`) where the device has them, bigger batches
everywhere. It supersedes the overhead detector's finding for a compiled trial: that finding's
first fix is to compile, which this trial already does.
"""

from __future__ import annotations

from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.detectors.overhead import for_overhead
from workbench.analysis.findings import Finding


def find(ev: Evidence) -> list[Finding]:
    compiled = ev.profile.get("compiled") or {}
    launches, each_us = ev.profile.get("launches_per_step"), ev.profile.get("median_launch_us")
    overhead = next((f for f in ev.findings if f.kind == "overhead"), None)
    if not compiled or overhead is None or launches is None or each_us is None:
        return []
    eager = compiled.get("eager_launches_per_step")
    cut = f" (eager: {eager:.0f}; compiling cut {1 - launches / eager:.0%})" if eager else ""
    unit = "kernels" if ev.ctx.device_type == "cuda" else "op launches"
    summary = f"launch-bound: {launches:.0f} {unit} per step at ~{each_us:.1f} µs each{cut}; {overhead.summary}"
    optimizer_share = ev.profile.get("phase_share", {}).get("optimizer", 0.0)
    finding = Finding(
        kind="overhead",
        severity="bottleneck",
        title="Launch-bound compiled step",
        summary=summary,
        evidence={
            **overhead.evidence,
            "launches_per_step": launches,
            "median_launch_us": each_us,
            "eager_launches_per_step": eager,
            "generated_kernels": len(compiled.get("fused") or []),
        },
        score=overhead.score,
        recommendations=for_overhead(ev.ctx, optimizer_share),
    )
    ev.findings[:] = [f for f in ev.findings if f is not overhead]
    return [finding]


DETECTOR = Detector(
    name="launch-bound",
    reads="a compiled trial's profiled launches per step, each launch's median work, and the overhead finding",
    find=find,
)
