"""Per-rank data of a distributed trial as plain figures, and what they say (findings).

Pure functions over gathered rank data and `TrialResult`s: no torch, no drawing. The UI's
per-rank chart reads `rank_rows`; the diagnosis layer reads `distributed_findings`, whose
recommendations carry concrete config changes so a control panel can apply them.

Why two skews: ranks meet at every gradient synchronization, so their *step* times come out
nearly equal even when one rank is slow; the slow rank shows as more *compute* while the
others wait in communication. Step-time skew catches ranks that drift apart anyway.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import fmean, median
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.config import TrainConfig
    from workbench.measure.result import TrialResult

SYNC_BOUND_SHARE = 0.2
"""Exposed communication at or above this share of the step makes a trial synchronization bound."""
STRAGGLER_SKEW = 0.2
"""Compute (or step-time) spread across ranks, relative to the fastest, that names a straggler.
Above the 5-20% seen between identical CPU ranks sharing two busy cores here."""


def summarize_ranks(
    gathered: list[dict[str, Any]], config: TrainConfig, backend: str, world_size: int, step_comm_bytes: int | None
) -> dict[str, Any]:
    """`TrialResult.distributed` from every rank's local data (rank order)."""
    rows = [_rank_row(item) for item in gathered]
    profiled = [row for row in rows if row.get("compute_ms") is not None]
    summary: dict[str, Any] = {
        "strategy": config.strategy,
        "backend": backend,
        "world_size": world_size,
        "nproc_per_node": config.nproc_per_node,
        "nnodes": config.nnodes,
        "hosts": sorted({str(item.get("host", "")) for item in gathered}),
        "ranks": rows,
        "profiled_steps": gathered[0].get("profile", {}).get("steps") if gathered else None,
    }
    for key in ("step_ms", "compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms"):
        summary[key] = fmean(row[key] for row in profiled) if profiled else None
    comm, overlap, step = summary["comm_ms"], summary["overlap_ms"], summary["step_ms"]
    summary["hidden_share"] = overlap / comm if comm else None
    summary["comm_share"] = summary["exposed_comm_ms"] / step if step else None
    probes = [item["allreduce"] for item in gathered if item.get("allreduce")]
    summary["allreduce"] = max(probes, key=lambda p: p["time_ms"]) if probes else None  # the slowest rank bounds it
    summary["step_comm_bytes"] = step_comm_bytes
    summary["step_comm_gbps"] = step_comm_bytes / (comm / 1000.0) / 1e9 if step_comm_bytes and comm else None
    summary.update(_skews(rows))
    return summary


def _rank_row(item: dict[str, Any]) -> dict[str, Any]:
    steps = item.get("step_ms") or []
    row: dict[str, Any] = {
        "rank": item["rank"],
        "host": item.get("host", ""),
        "median_step_ms": median(steps) if steps else None,
        "peak_memory_bytes": item.get("peak_memory_bytes"),
    }
    profile = item.get("profile") or {}
    for key in ("step_ms", "compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms", "hidden_share"):
        row[key] = profile.get(key)
    return row


def _skews(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def spread(values: list[float]) -> float | None:
        return (max(values) - min(values)) / min(values) if len(values) > 1 and min(values) > 0 else None

    steps = [(row["median_step_ms"], row["rank"]) for row in rows if row["median_step_ms"] is not None]
    compute = [(row["compute_ms"], row["rank"]) for row in rows if row.get("compute_ms") is not None]
    slowest = max(compute)[1] if compute else (max(steps)[1] if steps else None)
    return {
        "rank_skew": spread([s for s, _ in steps]),
        "compute_skew": spread([c for c, _ in compute]),
        "slowest_rank": slowest,
    }


def rank_rows(result: TrialResult) -> list[dict[str, Any]]:
    """One row per rank for tables and charts: median step, compute, comm, overlap, memory."""
    if not result.distributed:
        return []
    return [dict(row) for row in result.distributed.get("ranks", [])]


# --- findings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    text: str
    changes: dict[str, Any] = field(default_factory=dict)
    """Config fields to change (empty when the advice is not a config toggle)."""


@dataclass(frozen=True)
class DistributedFinding:
    """One thing the per-rank figures show, with its evidence and what to try."""

    kind: str
    """'sync_bound' (communication not hidden) or 'straggler' (one rank slower than the rest)."""
    title: str
    severity: float
    """Share of the step it costs (0..1): sorts findings, biggest first."""
    detail: str
    evidence: dict[str, Any]
    recommendations: list[Recommendation]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def distributed_findings(result: TrialResult) -> list[DistributedFinding]:
    """What limits a distributed trial, biggest first; empty for single-process or healthy trials."""
    info = result.distributed
    if not info:
        return []
    findings = [f for f in (_sync_bound(result, info), _straggler(info)) if f is not None]
    return sorted(findings, key=lambda f: -f.severity)


def _sync_bound(result: TrialResult, info: dict[str, Any]) -> DistributedFinding | None:
    share = info.get("comm_share")
    if share is None or share < SYNC_BOUND_SHARE:
        return None
    hidden = info.get("hidden_share") or 0.0
    detail = (
        f"{info['exposed_comm_ms']:.1f} ms of every {info['step_ms']:.1f} ms step ({share:.0%}) is communication "
        f"no compute runs under; {hidden:.0%} of the {info['comm_ms']:.1f} ms of communication is hidden "
        f"under backward ({info['world_size']} {info['backend']} ranks, {info['strategy']})."
    )
    evidence = {k: info.get(k) for k in ("comm_share", "hidden_share", "exposed_comm_ms", "comm_ms", "step_ms")}
    evidence["allreduce"] = info.get("allreduce")
    return DistributedFinding(
        "sync_bound",
        "distributed synchronization bound",
        float(share),
        detail,
        evidence,
        _sync_recommendations(result, hidden),
    )


def _sync_recommendations(result: TrialResult, hidden: float) -> list[Recommendation]:
    cfg = result.config
    recs: list[Recommendation] = []
    if cfg.get("strategy") == "ddp":
        cap = cfg.get("ddp_bucket_cap_mb") or 25.0
        if hidden < 0.5:
            recs.append(
                Recommendation(
                    f"smaller gradient buckets start all-reduces earlier in backward (sweep {cap / 5:g}, {cap:g}, "
                    f"{cap * 4:g} MB: too small pays per-message latency)",
                    {"ddp_bucket_cap_mb": cap / 5},
                )
            )
        if not cfg.get("ddp_static_graph"):
            recs.append(
                Recommendation(
                    "a static graph lets DDP reorder buckets to the real gradient order", {"ddp_static_graph": True}
                )
            )
        if cfg.get("comm_hook") == "none":
            hook = "bf16" if _available(result, "comm_hook", "bf16") else "fp16"
            recs.append(Recommendation(f"a {hook} compression hook halves the bytes all-reduced", {"comm_hook": hook}))
        if not cfg.get("ddp_gradient_as_bucket_view"):
            recs.append(
                Recommendation("gradients as bucket views skip a copy per step", {"ddp_gradient_as_bucket_view": True})
            )
    elif cfg.get("strategy") == "fsdp2":
        if cfg.get("fsdp_reshard_after_forward", True):
            recs.append(
                Recommendation(
                    "keeping gathered parameters until backward removes the backward all-gathers (costs memory)",
                    {"fsdp_reshard_after_forward": False},
                )
            )
        if cfg.get("fsdp_param_dtype") == "fp32" and _available(result, "fsdp_param_dtype", "bf16"):
            changes: dict[str, Any] = {"fsdp_param_dtype": "bf16"}
            if cfg.get("amp") != "bf16":
                changes["amp"] = "bf16"
            recs.append(Recommendation("bf16 parameters halve the all-gather bytes", changes))
    recs.append(Recommendation("a larger per-rank batch raises compute per byte communicated (raise batch_size)"))
    return recs


def _straggler(info: dict[str, Any]) -> DistributedFinding | None:
    compute_skew, step_skew = info.get("compute_skew"), info.get("rank_skew")
    skew = max((s for s in (compute_skew, step_skew) if s is not None), default=None)
    if skew is None or skew < STRAGGLER_SKEW:
        return None
    slow = info.get("slowest_rank")
    rows = {row["rank"]: row for row in info.get("ranks", [])}
    row = rows.get(slow, {})
    what = (
        f"computes {compute_skew:.0%} longer than the fastest rank" if compute_skew else f"steps {step_skew:.0%} slower"
    )
    detail = (
        f"rank {slow} (host {row.get('host', '?')}) {what}; every other rank waits for it at each gradient "
        "synchronization."
    )
    recs = [
        Recommendation("check that rank's device: clocks, thermal throttling, other processes on it"),
        Recommendation("uneven data per rank (variable-length samples) also shows this way: balance the shards"),
    ]
    evidence = {"compute_skew": compute_skew, "rank_skew": step_skew, "slowest_rank": slow}
    return DistributedFinding(
        "straggler", f"straggler: rank {slow}", float(skew) / (1 + float(skew)), detail, evidence, recs
    )


def _available(result: TrialResult, name: str, value: str) -> bool:
    entry = (result.capabilities or {}).get(name, {}).get(value)
    return bool(entry and entry.get("available"))
