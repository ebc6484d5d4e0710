"""Every operator (and on CUDA every kernel) of the profiled window, per step: the input of an A/B diff.

`ProfileSummary.top_ops` keeps the few heaviest rows grouped by shape for reading; a diff needs
the whole table keyed by name, with the floating-point dtypes each op ran in, so that an op that
changed dtype (autocast), appeared (a fused kernel, a recompute) or disappeared is visible. Self
times only, so nested ops are never counted twice and the rows add up to the step's op time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The profiler's spelling of tensor dtypes -> torch's; scalar argument types ('Scalar', 'long int') are left out.
_DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::BFloat16": "bfloat16",
    "c10::Half": "float16",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
}


def op_table(
    events: list[Any],
    device_type: str,
    active_steps: int,
    skip: tuple[str, ...],
    dtypes_by_name: Mapping[str, set[str]] | None = None,
) -> list[dict[str, Any]]:
    """Host-side operators by name: self time per step (device self time on CUDA), calls, dtypes.

    `skip` names annotations that are not operators (our phase ranges, ProfilerStep#N).
    `dtypes_by_name` (`kineto_dtypes`) stands in for events without `input_dtypes` (torch < 2.13).
    """
    from torch.autograd import DeviceType

    on_device = device_type == "cuda"
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.device_type != DeviceType.CPU or event.name.startswith(skip):
            continue
        row = rows.setdefault(
            event.name, {"name": event.name, "self_us": 0.0, "host_us": 0.0, "calls": 0, "dtypes": set()}
        )
        row["self_us"] += float(event.self_device_time_total if on_device else event.self_cpu_time_total)
        row["host_us"] += float(event.self_cpu_time_total)
        row["calls"] += 1
        if hasattr(event, "input_dtypes"):
            row["dtypes"].update(_DTYPES[d] for d in (event.input_dtypes or []) if d in _DTYPES)
        elif dtypes_by_name:
            row["dtypes"].update(dtypes_by_name.get(event.name, ()))
    return [_per_step(row, active_steps) for row in sorted(rows.values(), key=lambda r: -r["self_us"])]


def kineto_dtypes(prof: Any, events: list[Any]) -> dict[str, set[str]]:
    """Each host operator's input dtypes by name, read from the kineto events; {} when not needed.

    The profiler's `FunctionEvent` carries `input_dtypes` only from torch 2.13; before, every row's
    dtypes would be empty and an autocast change ("float32 -> bfloat16") would never show in a
    diff. The kineto events underneath have had `dtypes()` far longer (2.11 has it). The op table
    groups by name, so joining by name gives the same union of dtypes per row.
    """
    from torch.autograd import DeviceType

    if not events or hasattr(events[0], "input_dtypes"):
        return {}
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        return {}
    by_name: dict[str, set[str]] = {}
    for event in results.events():
        if event.device_type() != DeviceType.CPU or not hasattr(event, "dtypes"):
            continue
        by_name.setdefault(event.name(), set()).update(_DTYPES[d] for d in event.dtypes() if d in _DTYPES)
    return by_name


def kernel_table(events: list[Any], active_steps: int) -> list[dict[str, Any]]:
    """CUDA kernels (and memcpy/memset) by name: device time and launches per step."""
    from torch.autograd import DeviceType

    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.device_type != DeviceType.CUDA:
            continue
        row = rows.setdefault(
            event.name, {"name": event.name, "self_us": 0.0, "host_us": 0.0, "calls": 0, "dtypes": set()}
        )
        row["self_us"] += float(event.time_range.elapsed_us())
        row["calls"] += 1
    return [_per_step(row, active_steps) for row in sorted(rows.values(), key=lambda r: -r["self_us"])]


def _per_step(row: dict[str, Any], active_steps: int) -> dict[str, Any]:
    steps = max(1, active_steps)
    return {
        "name": row["name"],
        "ms_per_step": row["self_us"] / 1000.0 / steps,
        "host_ms_per_step": row["host_us"] / 1000.0 / steps,
        "calls_per_step": row["calls"] / steps,
        "dtypes": sorted(row["dtypes"]),
    }
