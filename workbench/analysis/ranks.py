"""What a distributed trial's per-rank figures say: synchronization bound, a straggler rank, or a busy host.

Pure functions over `TrialResult.distributed` (the summary `distributed.stats` builds on rank 0,
with every rank's timeline). The straggler rule is `analysis.stragglers`'s, shared with watched
jobs. Each finding's recommendations carry concrete config changes, so a control panel can apply them.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.advice import Recommendation
from workbench.analysis.findings import Finding
from workbench.analysis.stragglers import PHASE_WORDS, HostLoad, RankSteps, StragglerCheck, check_stragglers
from workbench.measure.result import TrialResult

SYNC_BOUND_SHARE = 0.2
"""Exposed communication at or above this share of the step makes a trial synchronization bound."""


def distributed_findings(result: TrialResult) -> list[Finding]:
    """What limits a distributed trial, biggest first; empty for single-process or healthy trials."""
    info = result.distributed
    if not info:
        return []
    check = straggler_check(result)
    sync = _sync_bound(result, info, check)
    findings = [*([sync] if sync is not None else []), *straggler_findings(check, result.config)]
    return sorted(findings, key=lambda f: -f.score)


def distributed_notes(result: TrialResult) -> list[str]:
    """Why no straggler was named (the evidence that fell short), for a distributed trial."""
    check = straggler_check(result)
    if check is None or check.straggler is not None or check.contention is not None:
        return []
    return ["no straggler named — " + "; ".join(check.reasons)]


def _sync_bound(result: TrialResult, info: dict[str, Any], check: StragglerCheck | None) -> Finding | None:
    """Communication itself on the critical path — not the waiting for a late rank, which is the straggler's.

    The rank that arrives last at a synchronization waits only for the transfer: its wait (from the
    timeline, or its exposed communication in the profiled window) is the communication itself."""
    comm: float | None
    if check is not None and check.wait_measured and check.comm_ms is not None:
        comm, step, source = check.comm_ms, check.step_ms, "the last-arriving rank's wait at the synchronizations"
    else:
        step = float(info.get("step_ms") or result.median_step_ms or 0.0)
        exposed = [row["exposed_comm_ms"] for row in info.get("ranks", []) if row.get("exposed_comm_ms") is not None]
        comm, source = (min(exposed) if exposed else None), "the profiled window, least exposed rank"
        if comm is None and info.get("comm_share") is not None:  # a summary without per-rank rows
            comm, source = info["comm_share"] * step, "the profiled window"
    if comm is None or not step or comm / step < SYNC_BOUND_SHARE:
        return None
    share = comm / step
    hidden = info.get("hidden_share") or 0.0
    waiting = ""
    if check is not None and check.straggler is not None and check.others_wait_ms is not None:
        waiting = (
            f"; the other ranks wait {check.others_wait_ms - comm:.1f} ms more for rank {check.candidate}, "
            "which is lateness, not communication"
        )
    summary = (
        f"{comm:.1f} ms of every {step:.1f} ms step ({share:.0%}) is communication itself that no compute hides "
        f"({source}); {hidden:.0%} of the {info.get('comm_ms') or 0:.1f} ms of communication is hidden under "
        f"backward ({info['world_size']} {info['backend']} ranks, {info['strategy']}){waiting}."
    )
    evidence = {k: info.get(k) for k in ("comm_share", "hidden_share", "exposed_comm_ms", "comm_ms", "step_ms")}
    evidence.update({"communication_ms": comm, "communication_share": share, "allreduce": info.get("allreduce")})
    advice = _sync_advice(result, hidden)
    recs = [
        _recommendation(text, changes, "less communication exposed on the step's critical path", summary, rank)
        for rank, (text, changes) in enumerate(advice, start=1)
    ]
    return Finding("distributed", "bottleneck", "distributed synchronization bound", summary, evidence, share, recs)


def _sync_advice(result: TrialResult, hidden: float) -> list[tuple[str, dict[str, Any]]]:
    cfg = result.config
    advice: list[tuple[str, dict[str, Any]]] = []
    if cfg.get("strategy") == "ddp":
        cap = cfg.get("ddp_bucket_cap_mb") or 25.0
        if hidden < 0.5:
            advice.append(
                (
                    f"smaller gradient buckets start all-reduces earlier in backward (sweep {cap / 5:g}, {cap:g}, "
                    f"{cap * 4:g} MB: too small pays per-message latency)",
                    {"ddp_bucket_cap_mb": cap / 5},
                )
            )
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
            advice.append(
                (
                    "keeping gathered parameters until backward removes the backward all-gathers (costs memory)",
                    {"fsdp_reshard_after_forward": False},
                )
            )
        if cfg.get("fsdp_param_dtype") == "fp32" and _available(result, "fsdp_param_dtype", "bf16"):
            changes: dict[str, Any] = {"fsdp_param_dtype": "bf16"}
            if cfg.get("amp") != "bf16":
                changes["amp"] = "bf16"
            advice.append(("bf16 parameters halve the all-gather bytes", changes))
    advice.append(("a larger per-rank batch raises compute per byte communicated (raise batch_size)", {}))
    return advice


def straggler_check(result: TrialResult) -> StragglerCheck | None:
    """Every rank's timeline read for a straggler (None for a single-process trial or an old result)."""
    info = result.distributed or {}
    timeline = info.get("timeline")
    if not timeline:
        return None
    ranks = [_rank_steps(item) for item in timeline]
    loads = [HostLoad(h["busy_cores"], h["ranks_cores"], h["cores"], h["host"]) for h in info.get("host_load") or []]
    return check_stragglers(ranks, loads)


def straggler_findings(check: StragglerCheck | None, config: dict[str, Any]) -> list[Finding]:
    """The named straggler with its cause, or the busy host that stood in the way of naming one."""
    if check is None:
        return []
    evidence = {k: v for k, v in check.to_dict().items() if k != "ranks"}
    if check.straggler is not None:
        summary = check.sentence() + "."
        recs = [
            _recommendation(text, changes, "the other ranks stop waiting for it", summary, rank)
            for rank, (text, changes) in enumerate(straggler_advice(check, config), start=1)
        ]
        title = f"straggler: rank {check.straggler} ({PHASE_WORDS[check.cause or 'unexplained']})"
        score = min(1.0, (check.others_wait_ms or check.late_ms) / check.step_ms) if check.step_ms else 0.0
        return [Finding("distributed", "bottleneck", title, summary, evidence, score, recs)]
    if check.contention is not None:
        load = check.contention
        summary = (
            f"other processes kept {load.other_cores:.1f} of the host's {load.cores} cores busy while the ranks "
            f"used {load.ranks_cores:.1f}: rank {check.candidate} ran {check.late_ms:.1f} ms late "
            f"({PHASE_WORDS[check.cause or 'unexplained']}), which that contention alone can cause, so no "
            "rank is blamed"
        )
        recs = [
            _recommendation(
                "measure on a quiet host (or stop the other work), then look again",
                {},
                "a straggler verdict that is about the ranks, not their neighbours",
                summary,
                1,
            )
        ]
        return [Finding("threads", "info", "host busy: no straggler named", summary, evidence, 0.0, recs)]
    return []


def straggler_advice(check: StragglerCheck, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """What to look at, by the phase that makes the rank late."""
    rank = check.straggler
    if check.cause == "data":
        workers = int(config.get("num_workers") or 0)
        return [
            (
                f"more loader workers keep rank {rank}'s batches ready (num_workers {workers} -> {max(2, workers * 2)})",
                {"num_workers": max(2, workers * 2)},
            ),
            (
                f"check rank {rank}'s input path: a slower disk or network mount on its host, or its shard holding "
                "heavier samples (balance the shards)",
                {},
            ),
        ]
    if check.cause in ("forward", "backward"):
        return [
            (f"check rank {rank}'s device: clocks, thermal throttling, other processes on its GPU or cores", {}),
            (
                f"uneven work per rank (variable-length samples, a bigger shard on rank {rank}) also shows this way: "
                "balance the shards",
                {},
            ),
        ]
    if check.cause == "optimizer":
        return [
            (
                f"rank {rank}'s optimizer step is slow: check its device, and whether that rank does extra work in the "
                "step (gradient clipping with a sync, logging norms)",
                {},
            ),
        ]
    return [
        (
            f"rank {rank} does extra work between its steps (logging, checkpointing or evaluation on one rank only): "
            "move it off the step, or onto every rank at once",
            {},
        ),
    ]


def _rank_steps(item: dict[str, Any]) -> RankSteps:
    steps = list(item.get("step_ms") or [])
    phases = {name: list(values) for name, values in (item.get("phase_ms") or {}).items()}
    return RankSteps(
        int(item["rank"]),
        list(range(len(steps))),
        steps,
        phases,
        item.get("sync_wait_ms"),
        item.get("phase_wait_ms"),
        str(item.get("host", "")),
        item.get("cpu_ms"),
        item.get("cpu_wait_ms"),
    )


def _recommendation(title: str, changes: dict[str, Any], expected: str, why: str, rank: int) -> Recommendation:
    return Recommendation(title=title, changes=changes, expected=expected, why=why, rank=rank)


def _available(result: TrialResult, name: str, value: str) -> bool:
    entry = (result.capabilities or {}).get(name, {}).get(value)
    return bool(entry and entry.get("available"))
