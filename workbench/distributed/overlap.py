"""Compute vs communication time per step, and how much communication hides under compute.

Read from a short profiled window (never the timed one: the profiler costs ~10% on CPU).
Communication is every collective the profiler saw: NCCL kernels on a GPU; on CPU gloo's
worker-thread spans (`gloo:all_reduce`, ...) plus the `c10d::` calls during which the training
thread is blocked launching or waiting. Compute is the GPU's other kernels, or on CPU the
training thread's ops, each counted for its self time (gaps between ops are overhead). `overlap` is the time both ran at
once, so `exposed = comm - overlap` is what communication adds to the step, and
`hidden_share = overlap / comm` is the share of communication hidden under backward.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Interval = tuple[float, float]
"""(start, end) in microseconds."""

_COMM = re.compile(r"^(gloo:|c10d::|record_param_comms)|nccl", re.IGNORECASE)
_NOT_COMPUTE = re.compile(r"^(ProfilerStep#|\[memory\]|workbench:)")


def is_comm(name: str) -> bool:
    return bool(_COMM.search(name))


@dataclass(frozen=True)
class CommProfile:
    """One rank's per-step averages over the profiled window (milliseconds)."""

    steps: int
    step_ms: float
    compute_ms: float
    comm_ms: float
    overlap_ms: float

    @property
    def exposed_comm_ms(self) -> float:
        """Communication time no compute ran under: what it adds to the step."""
        return max(0.0, self.comm_ms - self.overlap_ms)

    @property
    def hidden_share(self) -> float | None:
        """Share of communication overlapped by compute (None when there was none)."""
        return self.overlap_ms / self.comm_ms if self.comm_ms > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exposed_comm_ms": self.exposed_comm_ms, "hidden_share": self.hidden_share}


# --- interval arithmetic -------------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: Sequence[Interval]) -> float:
    return sum(end - start for start, end in union(intervals))


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Time covered by both (inputs need not be disjoint)."""
    ua, ub = union(a), union(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(ua) and j < len(ub):
        start, end = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if end > start:
            out.append((start, end))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Time covered by `a` but not by `b`."""
    out: list[Interval] = []
    holes = union(b)
    for start, end in union(a):
        cursor = start
        for h_start, h_end in holes:
            if h_end <= cursor or h_start >= end:
                continue
            if h_start > cursor:
                out.append((cursor, h_start))
            cursor = max(cursor, h_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def comm_profile(compute: Sequence[Interval], comm: Sequence[Interval], window_ms: float, steps: int) -> CommProfile:
    """Per-step averages from the window's compute and communication intervals."""
    steps = max(1, steps)
    per_step = 1000.0 * steps  # microseconds → milliseconds per step
    return CommProfile(
        steps=steps,
        step_ms=window_ms / steps,
        compute_ms=length(compute) / per_step,
        comm_ms=length(comm) / per_step,
        overlap_ms=length(intersect(compute, comm)) / per_step,
    )


# --- from a torch.profiler run ----------------------------------------------------------


def intervals_from_events(events: Iterable[Any], device_type: str) -> tuple[list[Interval], list[Interval]]:
    """(compute, comm) intervals from `profiler.events()` (FunctionEvents).

    On CUDA only device kernels count (host-side launches are not the work). On CPU, threads
    that ran gloo spans are gloo's own; on the other threads every op's self time is compute.
    """
    from torch.autograd import DeviceType

    events = list(events)
    if device_type == "cuda":
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        return [_span(e) for e in kernels if not is_comm(e.name)], [_span(e) for e in kernels if is_comm(e.name)]
    return _cpu_intervals([e for e in events if e.device_type == DeviceType.CPU])


def _cpu_intervals(cpu: list[Any]) -> tuple[list[Interval], list[Interval]]:
    comm_threads = {e.thread for e in cpu if e.name.startswith(("gloo:", "nccl:"))}
    comm = [_span(e) for e in cpu if is_comm(e.name)]
    # Each op's self time (its span minus its children's) is work done by the op itself; summed
    # over ops it is the thread's compute, while gaps (Python, waits) and spans blocked in a
    # collective are not. record_function annotations are labels, not work.
    training = [e for e in cpu if e.thread not in comm_threads]
    blocked = [_span(e) for e in training if is_comm(e.name)]
    compute: list[Interval] = []
    for e in training:
        if is_comm(e.name) or getattr(e, "is_user_annotation", False) or _NOT_COMPUTE.match(e.name):
            continue
        compute += subtract([_span(e)], [_span(c) for c in e.cpu_children])
    return subtract(compute, blocked), comm


def _span(event: Any) -> Interval:
    return (float(event.time_range.start), float(event.time_range.end))
