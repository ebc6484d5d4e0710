"""What the compiler made of a profiled compiled step: the kernels it generated, the ATen ops each
fused, what stayed extern (matmul/conv libraries), and how many launches a step makes against eager.

Read from the profiler's own events, not from inductor's generated source: a generated kernel is an
event named as inductor names it (`cpp_fused_<ops>_<n>` on CPU, `triton_<kind>_fused_<ops>_<n>` on
GPU, the ops being the fused nodes' original ATen ops while `descriptive_names` is 'original_aten',
inductor's default). On CPU those events exist only when the kernels were generated with profiler
ranges (`torch._inductor.config.cpp.enable_kernel_profile`, a private setting: `kernel_ranges` turns
it on for a profiled compiled trial before it compiles; with no profiler running, a range is one
check per kernel call). An extern call is an ATen op run inside a compiled graph's call. Launches
per step count the leaf operator calls of the compute phases on CPU (each a dispatch, the CPU face
of a launch) and the device kernels on CUDA.
"""

from __future__ import annotations

import contextlib
import re
import statistics
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

#: Inductor's generated kernels as the profiler names them (a CPU range may carry a `graph_N_` prefix).
_GENERATED = re.compile(
    r"^(?:graph_\d+_)?(?P<kind>cpp|triton)_(?:(?:poi|red|per|tem|mix|spl)_)?fused_(?P<ops>.*?)(?:_\d+)?$"
)
#: A compiled graph's call on the host (torch >= 2.5 names it so); the ops under it are extern calls.
_GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph")
_OPERATORS = ("aten::", "mkldnn::", "torchvision::")
#: What a compiled graph's call runs that is bookkeeping, not a kernel: its buffers and views of them.
_NOT_EXTERN = frozenset(
    {"empty", "empty_strided", "as_strided", "view", "_reshape_alias", "resize_", "detach", "alias"}
)


@contextlib.contextmanager
def kernel_ranges(enabled: bool) -> Iterator[None]:
    """Inductor's CPU kernels generated with profiler ranges around them while inside. Must cover the
    first compiled step: the ranges are baked into the generated code. A torch without the setting
    lists no CPU kernel, and the profile's note says so (`compiled_kernels`)."""
    patch: Any = contextlib.nullcontext()
    if enabled:
        try:
            import torch._inductor.config as inductor_config

            patch = inductor_config.patch({"cpp.enable_kernel_profile": True})
        except Exception:  # a private setting that moved: the trial runs on, without the CPU kernel list
            patch = contextlib.nullcontext()
    with patch:
        yield


def generated_kernel(name: str) -> tuple[str, list[str]] | None:
    """(kind, fused ATen ops) of an inductor-generated kernel's name; None for any other name."""
    match = _GENERATED.match(name)
    if match is None:
        return None
    return match["kind"], split_ops(match["ops"])


def split_ops(joined: str) -> list[str]:
    """'gelu_native_layer_norm' -> ['gelu', 'native_layer_norm']: the longest ATen op name at each
    place (names hold underscores, so a plain split would cut 'layer_norm' in two). A part no ATen
    op starts with stays whole."""
    names, parts, ops, start = _aten_names(), joined.split("_"), [], 0
    while start < len(parts):
        end = next((e for e in range(len(parts), start, -1) if "_".join(parts[start:e]) in names), None)
        if end is None:  # not an op name (a truncated list, an unknown op): keep the rest as one word
            ops.append("_".join(parts[start:]))
            break
        ops.append("_".join(parts[start:end]))
        start = end
    return [op for op in ops if op]


@lru_cache(maxsize=1)
def _aten_names() -> frozenset[str]:
    import torch

    try:
        every = torch._C._dispatch_get_all_op_names()  # private; absent: the kernel's whole suffix is one word
    except Exception:
        return frozenset()
    return frozenset(name.split("::", 1)[1].split(".", 1)[0] for name in every if name.startswith("aten::"))


def compiled_kernels(
    events: list[Any], device_type: str, active_steps: int, inside: Callable[[Any], bool]
) -> dict[str, Any]:
    """The compiled step's kernels from one profiled window's events; {} when it ran no compiled graph.

    `inside(event)` says whether a host event lies in a compute phase (forward, backward, optimizer)."""
    if not any(_GRAPH_CALL.match(e.name) or generated_kernel(e.name) for e in events):
        return {}
    steps = max(1, active_steps)
    on_device = device_type == "cuda"
    fused = _fused_rows(events, on_device, steps)
    extern = _extern_rows(events, steps)
    note = ""
    if not fused:
        note = (
            "no generated kernel was in the profile: on CPU the kernels are listed only when compiled with "
            "profiler ranges (a profiled trial compiles with them); the backend may not generate kernels"
        )
    return {
        "fused": fused,
        "extern": extern,
        "fused_share": _fused_share(events, on_device, inside),
        "note": note,
    }


def launches(events: list[Any], device_type: str, inside: Callable[[Any], bool]) -> int:
    """Device kernels on CUDA; on CPU the leaf operator calls (generated kernels included) in the
    compute phases: an op that calls others launches nothing itself."""
    from torch.autograd import DeviceType

    if device_type == "cuda":
        return sum(1 for e in events if e.device_type == DeviceType.CUDA)
    return sum(1 for e in events if _is_cpu_op(e) and inside(e) and not any(_is_cpu_op(c) for c in e.cpu_children))


def median_launch_us(events: list[Any], device_type: str, inside: Callable[[Any], bool]) -> float | None:
    """Median time of one launch's work (device time on CUDA, self time of a leaf op on CPU)."""
    from torch.autograd import DeviceType

    if device_type == "cuda":
        times = [e.time_range.elapsed_us() for e in events if e.device_type == DeviceType.CUDA]
    else:
        times = [
            e.self_cpu_time_total
            for e in events
            if _is_cpu_op(e) and inside(e) and not any(_is_cpu_op(c) for c in e.cpu_children)
        ]
    return float(statistics.median(times)) if times else None


def _is_cpu_op(event: Any) -> bool:
    from torch.autograd import DeviceType

    return event.device_type == DeviceType.CPU and (
        event.name.startswith(_OPERATORS) or bool(generated_kernel(event.name))
    )


def _fused_rows(events: list[Any], on_device: bool, steps: int) -> list[dict[str, Any]]:
    from torch.autograd import DeviceType

    wanted = DeviceType.CUDA if on_device else DeviceType.CPU
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        parsed = generated_kernel(event.name) if event.device_type == wanted else None
        if parsed is None:
            continue
        kind, ops = parsed
        row = rows.setdefault(event.name, {"name": event.name, "kind": kind, "ops": ops, "us": 0.0, "calls": 0})
        row["us"] += float(event.time_range.elapsed_us() if on_device else event.self_cpu_time_total)
        row["calls"] += 1
    return _per_step(rows, steps)


def _extern_rows(events: list[Any], steps: int) -> list[dict[str, Any]]:
    """The ATen ops a compiled graph calls itself (inductor's extern kernels: mm, addmm, convolution,
    and any op it had no lowering for), less its buffer allocations and views."""
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        parent = event.cpu_parent
        if not event.name.startswith(_OPERATORS) or parent is None or not _GRAPH_CALL.match(parent.name):
            continue
        if event.name.split("::", 1)[1] in _NOT_EXTERN:
            continue
        row = rows.setdefault(event.name, {"name": event.name, "kind": "extern", "ops": [], "us": 0.0, "calls": 0})
        row["us"] += float(event.cpu_time_total)
        row["calls"] += 1
    return _per_step(rows, steps)


def _fused_share(events: list[Any], on_device: bool, inside: Callable[[Any], bool]) -> float | None:
    """The generated kernels' share of the compute phases' op time (device kernel time on CUDA)."""
    from torch.autograd import DeviceType

    if on_device:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        total = sum(e.time_range.elapsed_us() for e in kernels)
        fused = sum(e.time_range.elapsed_us() for e in kernels if generated_kernel(e.name))
    else:
        ops = [e for e in events if _is_cpu_op(e) and inside(e)]
        total = sum(e.self_cpu_time_total for e in ops)
        fused = sum(e.self_cpu_time_total for e in ops if generated_kernel(e.name))
    return fused / total if total > 0 else None


def _per_step(rows: dict[str, dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    ranked = sorted(rows.values(), key=lambda r: -r["us"])
    return [
        {
            "name": r["name"],
            "kind": r["kind"],
            "ops": r["ops"],
            "ms_per_step": r["us"] / 1000.0 / steps,
            "calls_per_step": r["calls"] / steps,
        }
        for r in ranked
    ]
