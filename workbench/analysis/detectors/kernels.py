"""Compute-bound or memory-bandwidth-bound, from the kernel mix, when kernels fill the step.

Reads the profiled window's kernel-time mix (matmul/conv/attention vs element-wise, normalization,
copies) and MFU where the device has a peak in the table. A compute-bound step is where a
well-balanced step should be ('info': its advice makes the arithmetic itself faster); a
bandwidth-bound one moves bytes rather than computing (compile fuses, bf16 halves the bytes).
"""

from __future__ import annotations

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding

#: Kernel-mix thresholds, applied only when kernels fill at least KERNEL_BOUND of the compute phases.
KERNEL_BOUND = 0.5
COMPUTE_HEAVY_SHARE = 0.5
MEMORY_BOUND_SHARE = 0.6
#: MFU above which a GPU step is compute-bound whatever the kernel mix.
HIGH_MFU = 0.4


def find(ev: Evidence) -> list[Finding]:
    ctx, mfu = ev.ctx, ev.mfu
    mix = ev.profile.get("kernel_mix") or {}
    overhead = ev.profile.get("overhead") or {}
    if not mix:
        return []
    idle_key = "device_idle_share" if ctx.device_type == "cuda" else "framework_overhead_share"
    busy_share = 1.0 - float(overhead.get(idle_key) or 0.0)
    heavy, conv, light = mix.get("compute_heavy", 0.0), mix.get("conv", 0.0), mix.get("memory_bound", 0.0)
    evidence = {
        "kernel_busy_share": busy_share,
        "compute_heavy_share": heavy,
        "conv_share": conv,
        "memory_bound_share": light,
        "mfu": mfu.mfu,
        "achieved_tflops": (mfu.achieved_flops or 0) / 1e12,
    }
    mfu_text = f"MFU {mfu.mfu:.0%} of {mfu.peak_source}" if mfu.mfu is not None else f"MFU n/a ({mfu.peak_source})"
    if mfu.achieved_flops:
        mfu_text += f"; achieved {mfu.achieved_flops / 1e9:.1f} GFLOP/s"
    if busy_share < KERNEL_BOUND:
        return []
    score = busy_share * (1.0 - ev.data_share)
    if heavy >= COMPUTE_HEAVY_SHARE or (mfu.mfu is not None and mfu.mfu >= HIGH_MFU):
        compute = Finding(
            kind="compute",
            severity="info",
            title="Compute bound",
            summary=f"{heavy:.0%} of kernel time is matmul/conv/attention arithmetic ({conv:.0%} convolutions); "
            f"{mfu_text}",
            evidence=evidence,
            score=score * heavy,
            recommendations=for_compute(ctx, conv, mfu.mfu),
        )
        return [compute]
    if light >= MEMORY_BOUND_SHARE and (mfu.mfu is None or mfu.mfu < HIGH_MFU):
        bandwidth = Finding(
            kind="memory-bandwidth",
            severity="bottleneck",
            title="Memory-bandwidth bound",
            summary=f"{light:.0%} of kernel time is element-wise, normalization, copy and optimizer ops, "
            f"limited by memory traffic rather than arithmetic; {mfu_text}",
            evidence=evidence,
            score=score * light,
            recommendations=for_bandwidth(ctx, conv),
        )
        return [bandwidth]
    return []


def for_compute(ctx: Context, conv_share: float, mfu: float | None) -> list[Recommendation]:
    recs = [
        Recommendation(
            "Run matmuls and convolutions in bf16",
            {"amp": "bf16"},
            "tensor cores (or the CPU's bf16 units) run bf16 at several times the fp32 rate",
            "the step is spent in matmul/conv arithmetic, which bf16 speeds up directly",
        ),
        Recommendation(
            "Allow TF32 for fp32 matmuls",
            {"matmul_precision": "high"},
            "fp32 matmuls run on tensor cores at ≈8× the fp32 rate (Ampere and newer)",
            "TF32 keeps fp32's range with a 10-bit mantissa; training is unaffected in practice",
        ),
        Recommendation(
            "Use channels_last memory format",
            {"channels_last": True} if conv_share >= 0.2 else {},
            f"convolutions take {conv_share:.0%} of kernel time; NHWC kernels are the fast path",
            "cuDNN/oneDNN convolution kernels are written for NHWC",
        ),
        Recommendation(
            "Compile the model",
            {"compile": "default"},
            "fuses the element-wise work around the matmuls; the matmuls themselves stay",
            "less memory traffic between the compute-heavy ops",
        ),
    ]
    if mfu is not None and mfu >= 0.5:
        recs = [r for r in recs if r.changes.get("amp") or r.changes.get("matmul_precision")]
    return ctx.offer([r for r in recs if r.changes])


def for_bandwidth(ctx: Context, conv_share: float) -> list[Recommendation]:
    recs = [
        Recommendation(
            "Compile the model to fuse element-wise ops",
            {"compile": "default"},
            "chains of element-wise/normalization ops become one kernel that reads and writes each tensor once",
            "these ops are limited by memory traffic, not arithmetic",
        ),
        Recommendation(
            "Train in bf16",
            {"amp": "bf16"},
            "halves the bytes every activation read and write moves",
            "memory-bound ops run at bytes/bandwidth: fewer bytes, less time",
        ),
        Recommendation(
            "Use channels_last memory format",
            {"channels_last": True} if conv_share >= 0.2 else {},
            "avoids layout conversions around convolutions",
            "NCHW convolutions may transpose to NHWC and back, twice the traffic",
        ),
    ]
    return ctx.offer([r for r in recs if r.changes])


DETECTOR = Detector(
    name="kernels",
    reads="the profiled window's kernel-time mix and MFU, when kernels fill the compute phases",
    find=find,
)
