"""Memory bound: the trial's peak memory against the device's.

Reads `peak_memory_bytes` and `memory_breakdown` with the device's total memory (CUDA only: a CPU
trial records no device total). The fixes trade compute for memory: checkpointing, bf16.
"""

from __future__ import annotations

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding

#: Peak memory share of the device above which memory is the constraint.
MEMORY_SHARE = 0.85


def find(ev: Evidence) -> list[Finding]:
    result = ev.result
    total = result.device.get("total_memory_bytes")
    peak = result.peak_memory_bytes
    if not total or not peak or peak / total < MEMORY_SHARE:
        return []
    share = peak / total
    largest = sorted((result.memory_breakdown or {}).items(), key=lambda kv: -kv[1])[:2]
    parts = ", ".join(f"{name} {value / 2**30:.1f} GiB" for name, value in largest)
    finding = Finding(
        kind="memory",
        severity="bottleneck",
        title="Memory bound",
        summary=f"peak {peak / 2**30:.1f} GiB is {share:.0%} of the device's {total / 2**30:.0f} GiB ({parts})",
        evidence={"peak_bytes": peak, "device_bytes": total, "share": share, "breakdown": result.memory_breakdown},
        score=share - MEMORY_SHARE,
        recommendations=for_memory(ev.ctx),
    )
    return [finding]


def for_memory(ctx: Context) -> list[Recommendation]:
    recs = [
        Recommendation(
            "Checkpoint activations selectively",
            {"activation_checkpointing": "selective"},
            "activations shrink by the element-wise ops' share at ≈5-10% more compute",
            "matmul/conv outputs are kept, cheap ops are recomputed in backward",
        ),
        Recommendation(
            "Checkpoint activations fully",
            {"activation_checkpointing": "full"},
            "activations shrink to the blocks' inputs at ≈30% more compute",
            "each block's forward runs again in backward instead of being stored",
        ),
        Recommendation(
            "Train in bf16",
            {"amp": "bf16"},
            "activations stored in bf16 take half the memory",
            "autocast keeps matmul/conv outputs in bf16",
        ),
    ]
    return ctx.offer(recs)


DETECTOR = Detector(
    name="memory",
    reads="the peak memory and its breakdown against the device's total memory",
    find=find,
)
