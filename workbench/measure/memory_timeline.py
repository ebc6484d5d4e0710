"""Memory through one step: allocated bytes over time by category, phase boundaries, the op at the peak.

Source: PyTorch's own memory profiler (`torch.profiler._memory_profiler`, which categorizes every
tensor as parameter, gradient, optimizer state, activation, temporary, ...; it works on CPU and
CUDA). It is a private API, so this is the one module that touches it: a PyTorch that moved it
gets `MemoryTimelineUnavailable` naming its version. The step runs with shapes, stacks and memory
recorded (+80% step time on CPU), so it is one extra step of the profiled window, never a timed one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.measure.ranges import RANGE_PREFIX

#: Our categories, in stacking order (bottom first). 'other' holds the batch (inputs), autograd's
#: own buffers and allocations the profiler could not tie to a tensor.
CATEGORIES = ("parameters", "optimizer_state", "gradients", "activations", "temporaries", "other")
_FROM_TORCH = {
    "PARAMETER": "parameters",
    "OPTIMIZER_STATE": "optimizer_state",
    "GRADIENT": "gradients",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
}
DEFAULT_MAX_SAMPLES = 400
#: Ops that begin a module's forward: one of them running inside the backward phase is a recompute
#: (activation checkpointing re-running the forward to rebuild what it did not keep).
FORWARD_ENTRY_OPS = frozenset({
    "aten::convolution", "aten::linear", "aten::scaled_dot_product_attention", "aten::layer_norm",
    "aten::batch_norm", "aten::group_norm", "aten::embedding",
})  # fmt: skip


class MemoryTimelineUnavailable(RuntimeError):
    """PyTorch's private memory profiler moved or changed; the message names the version and the way out."""


def memory_profiler_api() -> tuple[Any, Any, Any]:
    """(MemoryProfileTimeline, Action, TensorKey) from torch's private module, or a clear error."""
    import torch

    try:
        from torch.profiler._memory_profiler import Action, MemoryProfileTimeline, TensorKey
    except ImportError as exc:
        raise MemoryTimelineUnavailable(
            f"torch {torch.__version__} has no torch.profiler._memory_profiler.MemoryProfileTimeline ({exc}); "
            "the memory timeline needs a torch that has it (2.1 to 2.13 do): pin torch, or profile without it "
            "(ProfileOptions(memory_timeline=False))"
        ) from None
    for name in ("PREEXISTING", "CREATE", "INCREMENT_VERSION", "DESTROY"):
        if not hasattr(Action, name):
            raise MemoryTimelineUnavailable(
                f"torch {torch.__version__}: torch.profiler._memory_profiler.Action has no {name}; "
                "pin torch to 2.13 or profile with ProfileOptions(memory_timeline=False)"
            )
    return MemoryProfileTimeline, Action, TensorKey


def record_memory_timeline(
    run_step: Callable[[], None], device: Any, *, max_samples: int = DEFAULT_MAX_SAMPLES
) -> dict[str, Any]:
    """Run one step under the memory profiler and reduce it to plain data (see `reduce_timeline`)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    timeline_class, _, _ = memory_profiler_api()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    threads = torch.get_num_threads()
    # With 2+ intra-op threads (torch 2.13, CPU) the profiler's data-flow pass loses the forward's
    # activations (all 'other', activations 0 in the tiny BEV step); one thread keeps them. Bytes are
    # the same either way, and this step's time is not used.
    torch.set_num_threads(1)
    try:
        with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
            run_step()
    finally:
        torch.set_num_threads(threads)
    memory_profile = prof._memory_profile()
    if device.type == "cuda" and device.index is None:  # the profiler's keys carry the index: cuda:0, not cuda
        device = torch.device("cuda", torch.cuda.current_device())
    return reduce_timeline(timeline_class(memory_profile), memory_profile, str(device), max_samples=max_samples)


def reduce_timeline(
    timeline: Any, memory_profile: Any, device: str, *, max_samples: int = DEFAULT_MAX_SAMPLES
) -> dict[str, Any]:
    """{t_ms, total_bytes, categories: {name: [bytes]}, phases, peak} for one device, downsampled.

    `total_bytes` is summed from the raw allocation events without looking at categories; the
    categories are the same events split by what the profiler says each tensor is. Downsampling
    keeps, per bucket, the sample with the most memory, so the peak survives exactly.
    """
    import torch

    _, action, tensor_key = memory_profiler_api()
    target = torch.device(device)
    times: list[int] = []
    totals: list[int] = []
    rows: list[dict[str, int]] = []
    current = dict.fromkeys(CATEGORIES, 0)
    total = 0

    def add(key: Any, version: int, delta: int) -> None:
        torch_category = timeline.categories.get(key, version) if isinstance(key, tensor_key) else None
        name = _FROM_TORCH.get(torch_category.name, "other") if torch_category is not None else "other"
        current[name] += delta

    for t_ns, act, (key, version), size in timeline.timeline:
        if key.device != target:
            continue
        if act in (action.PREEXISTING, action.CREATE):
            add(key, version, size)
            total += size
        elif act == action.INCREMENT_VERSION:
            add(key, version, -size)
            add(key, version + 1, size)
        elif act == action.DESTROY:
            add(key, version, -size)
            total -= size
        if times and times[-1] == t_ns:
            rows[-1], totals[-1] = dict(current), total
        else:
            times.append(t_ns)
            rows.append(dict(current))
            totals.append(total)
    nodes = memory_profile._op_tree.sorted_nodes
    start_ns = min([t for t in times if t > 0] + [n.start_time_ns for n in nodes[:1]] or [0])
    times = [t if t > 0 else start_ns for t in times]  # pre-existing tensors have no time: the step's start
    keep = downsample_indices(totals, max_samples)
    peak = max(range(len(totals)), key=totals.__getitem__) if totals else None
    return {
        "device": device,
        "t_ms": [(times[i] - start_ns) / 1e6 for i in keep],
        "total_bytes": [totals[i] for i in keep],
        "categories": {name: [rows[i][name] for i in keep] for name in CATEGORIES},
        "samples": len(totals),
        "phases": _phases(nodes, start_ns),
        "recomputed_ops": recomputed_ops(nodes),
        "peak": _peak(nodes, times, totals, rows, peak, start_ns),
    }


def downsample_indices(values: list[int], max_samples: int) -> list[int]:
    """Indices of at most `max_samples` samples: the largest of each run of consecutive ones, plus the ends."""
    n = len(values)
    if n <= max_samples:
        return list(range(n))
    buckets = max(1, max_samples - 2)
    keep = {0, n - 1}
    for b in range(buckets):
        lo, hi = b * n // buckets, max(b * n // buckets + 1, (b + 1) * n // buckets)
        keep.add(max(range(lo, min(hi, n)), key=values.__getitem__))
    return sorted(keep)


def _phases(nodes: Any, start_ns: int) -> list[dict[str, Any]]:
    """The step's `workbench::<phase>` ranges as [{phase, start_ms, end_ms}]."""
    out = []
    for node in nodes:
        if node.name.startswith(RANGE_PREFIX):
            out.append({
                "phase": node.name[len(RANGE_PREFIX):],
                "start_ms": (node.start_time_ns - start_ns) / 1e6,
                "end_ms": (node.end_time_ns - start_ns) / 1e6,
            })  # fmt: skip
    return out


def recomputed_ops(nodes: Any) -> dict[str, int]:
    """Forward-entry ops (`FORWARD_ENTRY_OPS`) that ran inside the backward phase, by name."""
    backward = [(n.start_time_ns, n.end_time_ns) for n in nodes if n.name == RANGE_PREFIX + "backward"]
    counts: dict[str, int] = {}
    for node in nodes:
        if node.name in FORWARD_ENTRY_OPS and any(a <= node.start_time_ns <= b for a, b in backward):
            counts[node.name] = counts.get(node.name, 0) + 1
    return counts


def _peak(
    nodes: Any, times: list[int], totals: list[int], rows: list[dict[str, int]], index: int | None, start_ns: int
) -> dict[str, Any] | None:
    """The peak sample, what each category held then, and the op (and module) running at that moment."""
    if index is None:
        return None
    t_ns = times[index]
    running = [n for n in nodes if n.start_time_ns <= t_ns <= n.end_time_ns]
    ops = [n.name for n in running if n.name.startswith(("aten::", "mkldnn::", "torchvision::"))]
    modules = [n.name for n in running if n.name.startswith("nn.Module:")]
    nodes_ = [n.name for n in running if n.name.startswith("autograd::engine::evaluate_function:")]
    phases = [n.name[len(RANGE_PREFIX) :] for n in running if n.name.startswith(RANGE_PREFIX)]
    return {
        "t_ms": (t_ns - start_ns) / 1e6,
        "total_bytes": totals[index],
        "categories": dict(rows[index]),
        "op": ops[0] if ops else None,
        "inner_op": ops[-1] if ops else None,
        "module": modules[-1].removeprefix("nn.Module: ") if modules else None,
        "autograd_node": nodes_[-1].split(": ", 1)[-1] if nodes_ else None,
        "phase": phases[-1] if phases else None,
    }
