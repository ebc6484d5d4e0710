"""A compact Gantt of the profiled window: per step, its phases and its longest ops (and kernels on CUDA).

A raw trace of a 20-step window holds hundreds of thousands of events (Perfetto's job, from the
downloadable trace); this keeps at most `max_steps` steps and `max_bars` bars per lane and step,
so a notebook can draw it instantly. Lanes: 'phases', 'ops' (outermost host ops), on CUDA one per
stream ('stream 7') and 'communication' for NCCL kernels of distributed trials.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_BARS = 12
_COMM = ("nccl", "allreduce", "all_reduce", "reduce_scatter", "allgather", "all_gather")


def step_timeline(
    events: list[Any], range_prefix: str, *, max_steps: int = 20, max_bars: int = DEFAULT_MAX_BARS
) -> dict[str, Any]:
    """{steps: [{step, start_ms, end_ms}], bars: [{lane, name, step, start_ms, end_ms}], lanes, dropped_bars}.

    Times are ms from the first kept step's start. Within a step, each lane keeps its `max_bars`
    longest bars; `dropped_bars` counts what was left out (the trace has everything).
    """
    from torch.autograd import DeviceType

    steps = sorted((e for e in events if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start)
    steps = steps[:max_steps]
    if not steps:
        return {"steps": [], "bars": [], "lanes": [], "dropped_bars": 0}
    origin = steps[0].time_range.start
    bounds = [(s.time_range.start, s.time_range.end) for s in steps]
    candidates: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for event in events:
        lane = _lane(event, range_prefix, DeviceType)
        if lane is None:
            continue
        start, end = event.time_range.start, event.time_range.end
        index = _step_of(start, bounds)
        if index is None:
            continue
        name = event.name[len(range_prefix) :] if lane == "phases" else event.name
        candidates.setdefault((lane, index), []).append((start, end, name))
    bars, dropped = [], 0
    for (lane, index), items in candidates.items():
        items.sort(key=lambda item: item[1] - item[0], reverse=True)
        dropped += max(0, len(items) - max_bars)
        for start, end, name in items[:max_bars]:
            bars.append({"lane": lane, "name": name, "step": index,
                         "start_ms": (start - origin) / 1000.0, "end_ms": (end - origin) / 1000.0})  # fmt: skip
    bars.sort(key=lambda bar: (bar["lane"], bar["start_ms"]))
    lanes = sorted({bar["lane"] for bar in bars}, key=_lane_order)
    return {
        "steps": [
            {"step": i, "start_ms": (a - origin) / 1000.0, "end_ms": (b - origin) / 1000.0}
            for i, (a, b) in enumerate(bounds)
        ],
        "bars": bars,
        "lanes": lanes,
        "dropped_bars": dropped,
    }


def _lane(event: Any, range_prefix: str, device_type: Any) -> str | None:
    if event.device_type == device_type.CUDA:
        if any(word in event.name.lower() for word in _COMM):
            return "communication"
        return f"stream {getattr(event, 'device_resource_id', 0)}"
    if event.name.startswith(range_prefix):
        return "phases"
    if event.name.startswith("aten::") and not _has_op_parent(event):
        return "ops"
    return None


def _has_op_parent(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def _step_of(point: float, bounds: list[tuple[float, float]]) -> int | None:
    for index, (start, end) in enumerate(bounds):
        if start <= point <= end:
            return index
    return None


def _lane_order(lane: str) -> tuple[int, str]:
    order = {"phases": 0, "ops": 1, "communication": 3}
    return order.get(lane, 2), lane
