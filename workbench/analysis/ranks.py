"""What a distributed trial's per-rank figures say: synchronization bound, or a straggler rank.

Pure functions over `TrialResult.distributed` (the summary `distributed.stats` builds on rank 0).
Each finding's recommendations carry concrete config changes, so a control panel can apply them.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.findings import Finding
from workbench.analysis.recommend import Recommendation
from workbench.measure.result import TrialResult

SYNC_BOUND_SHARE = 0.2
"""Exposed communication at or above this share of the step makes a trial synchronization bound."""
STRAGGLER_SKEW = 0.2
"""Compute (or step-time) spread across ranks, relative to the fastest, that names a straggler.
Above the 5-20% seen between identical CPU ranks sharing two busy cores here."""


def distributed_findings(result: TrialResult) -> list[Finding]:
    """What limits a distributed trial, biggest first; empty for single-process or healthy trials."""
    info = result.distributed
    if not info:
        return []
    findings = [f for f in (_sync_bound(result, info), _straggler(info)) if f is not None]
    return sorted(findings, key=lambda f: -f.score)


def _sync_bound(result: TrialResult, info: dict[str, Any]) -> Finding | None:
    share = info.get("comm_share")
    if share is None or share < SYNC_BOUND_SHARE:
        return None
    hidden = info.get("hidden_share") or 0.0
    summary = (
        f"{info['exposed_comm_ms']:.1f} ms of every {info['step_ms']:.1f} ms step ({share:.0%}) is communication "
        f"no compute runs under; {hidden:.0%} of the {info['comm_ms']:.1f} ms of communication is hidden "
        f"under backward ({info['world_size']} {info['backend']} ranks, {info['strategy']})."
    )
    evidence = {k: info.get(k) for k in ("comm_share", "hidden_share", "exposed_comm_ms", "comm_ms", "step_ms")}
    evidence["allreduce"] = info.get("allreduce")
    advice = _sync_advice(result, hidden)
    recs = [_recommendation(text, changes, "less communication exposed on the step's critical path", summary, rank)
            for rank, (text, changes) in enumerate(advice, start=1)]  # fmt: skip
    return Finding(
        "distributed", "bottleneck", "distributed synchronization bound", summary, evidence, float(share), recs
    )


def _sync_advice(result: TrialResult, hidden: float) -> list[tuple[str, dict[str, Any]]]:
    cfg = result.config
    advice: list[tuple[str, dict[str, Any]]] = []
    if cfg.get("strategy") == "ddp":
        cap = cfg.get("ddp_bucket_cap_mb") or 25.0
        if hidden < 0.5:
            advice.append((
                f"smaller gradient buckets start all-reduces earlier in backward (sweep {cap / 5:g}, {cap:g}, "
                f"{cap * 4:g} MB: too small pays per-message latency)",
                {"ddp_bucket_cap_mb": cap / 5},
            ))  # fmt: skip
        if not cfg.get("ddp_static_graph"):
            advice.append(
                ("a static graph lets DDP reorder buckets to the real gradient order", {"ddp_static_graph": True})
            )
        if cfg.get("comm_hook") == "none":
            hook = "bf16" if _available(result, "comm_hook", "bf16") else "fp16"
            advice.append((f"a {hook} compression hook halves the bytes all-reduced", {"comm_hook": hook}))
        if not cfg.get("ddp_gradient_as_bucket_view"):
            advice.append(("gradients as bucket views skip a copy per step", {"ddp_gradient_as_bucket_view": True}))
    elif cfg.get("strategy") == "fsdp2":
        if cfg.get("fsdp_reshard_after_forward", True):
            advice.append((
                "keeping gathered parameters until backward removes the backward all-gathers (costs memory)",
                {"fsdp_reshard_after_forward": False},
            ))  # fmt: skip
        if cfg.get("fsdp_param_dtype") == "fp32" and _available(result, "fsdp_param_dtype", "bf16"):
            changes: dict[str, Any] = {"fsdp_param_dtype": "bf16"}
            if cfg.get("amp") != "bf16":
                changes["amp"] = "bf16"
            advice.append(("bf16 parameters halve the all-gather bytes", changes))
    advice.append(("a larger per-rank batch raises compute per byte communicated (raise batch_size)", {}))
    return advice


def _straggler(info: dict[str, Any]) -> Finding | None:
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
    summary = (
        f"rank {slow} (host {row.get('host', '?')}) {what}; every other rank waits for it at each gradient "
        "synchronization."
    )
    expected = "the other ranks stop waiting for the slowest one"
    recs = [
        _recommendation("check that rank's device: clocks, thermal throttling, other processes on it", {}, expected,
                        summary, 1),
        _recommendation("uneven data per rank (variable-length samples) also shows this way: balance the shards", {},
                        expected, summary, 2),
    ]  # fmt: skip
    evidence = {"compute_skew": compute_skew, "rank_skew": step_skew, "slowest_rank": slow}
    score = float(skew) / (1 + float(skew))
    return Finding("distributed", "bottleneck", f"straggler: rank {slow}", summary, evidence, score, recs)


def _recommendation(title: str, changes: dict[str, Any], expected: str, why: str, rank: int) -> Recommendation:
    return Recommendation(title=title, changes=changes, expected=expected, why=why, rank=rank)


def _available(result: TrialResult, name: str, value: str) -> bool:
    entry = (result.capabilities or {}).get(name, {}).get(value)
    return bool(entry and entry.get("available"))
