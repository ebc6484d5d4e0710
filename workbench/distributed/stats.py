"""Per-rank data of a distributed trial as plain figures (`TrialResult.distributed`).

Pure functions over gathered rank data: no torch, no drawing. The UI's per-rank chart reads
`rank_rows`; what the figures say is `workbench.analysis.ranks`'s job.

Why two skews: ranks meet at every gradient synchronization, so their *step* times come out
nearly equal even when one rank is slow; the slow rank shows as more *compute* while the
others wait in communication. Step-time skew catches ranks that drift apart anyway.
"""

from __future__ import annotations

from statistics import fmean, median
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.config import TrainConfig
    from workbench.measure.result import TrialResult


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
    # Per rank: collective kind -> count and bytes in one training step (`distributed.collectives`),
    # and the bytes of parameters it holds (a DTensor counts its local shard), whatever the layout.
    summary["collectives"] = [item.get("collectives") for item in gathered]
    summary["parameter_bytes"] = [item.get("parameter_bytes") for item in gathered]
    summary["step_comm_gbps"] = step_comm_bytes / (comm / 1000.0) / 1e9 if step_comm_bytes and comm else None
    summary.update(_skews(rows))
    summary["timeline"] = [_timeline(item) for item in gathered]
    summary["host_load"] = _host_load(gathered)
    return summary


def _timeline(item: dict[str, Any]) -> dict[str, Any]:
    """One rank's timed steps: step time, each phase, and the time it waited at synchronizations."""
    return {
        "rank": item["rank"],
        "host": item.get("host", ""),
        "step_ms": list(item.get("step_ms") or []),
        "phase_ms": dict(item.get("phase_ms") or {}),
        "sync_wait_ms": item.get("sync_wait_ms"),
        "phase_wait_ms": item.get("phase_wait_ms"),
        "cpu_ms": item.get("cpu_ms"),
        "cpu_wait_ms": item.get("cpu_wait_ms"),
    }


def _host_load(gathered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host: its busy cores during the timed window and how many of them the ranks used themselves.

    Each rank's own window probe counts the other ranks as 'other' work: only the ranks' sum,
    taken from the host's busy cores, leaves what other processes used."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for item in gathered:
        if item.get("cpu"):
            hosts.setdefault(str(item.get("host", "")), []).append(item["cpu"])
    return [
        {
            "host": host,
            "busy_cores": fmean(cpu["host_busy_cores"] for cpu in cpus),
            "ranks_cores": sum(cpu["cores_used"] for cpu in cpus),
            "cores": int(cpus[0]["host_cores"]),
        }
        for host, cpus in hosts.items()
    ]


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
    # The timed window's medians: where this rank's step goes, and how long it waits for the others.
    for phase, values in (item.get("phase_ms") or {}).items():
        row[f"median_{phase}_ms"] = _median(values)
    row["median_sync_wait_ms"] = _median(item.get("sync_wait_ms"))
    row["median_cpu_wait_ms"] = _median(item.get("cpu_wait_ms"))
    return row


def _median(values: list[float | None] | None) -> float | None:
    kept = [v for v in values or [] if v is not None]
    return median(kept) if kept else None


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
