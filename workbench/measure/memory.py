"""Peak training memory, measured the way each device allows.

CUDA: the caching allocator's peak over the timed window (`max_memory_allocated`).
CPU: process RSS cannot see activation memory come and go (glibc keeps freed pages),
so one extra step after the timed window runs under PyTorch's tensor-level
MemTracker, which also splits the peak by category and by module. MemTracker is a private
API (`torch.distributed._tools`): this is the one module that touches it. The estimator runs
the same tracker over fake tensors, with a model of the CUDA allocator's rounding patched in.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: MemTracker's category names → ours.
_CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Activation": "activations",
    "Temp": "temporaries",
    "Optstate": "optimizer_state",
    "Other": "other",
}


class MemoryTrackerUnavailable(RuntimeError):
    """PyTorch's private MemTracker moved or changed; the message says what to do."""


@dataclass
class MemoryReading:
    peak_bytes: int | None
    method: str
    breakdown: dict[str, int] | None = None
    modules: dict[str, dict[str, int]] | None = None
    """Per module (qualified name, '' = the model): parameters, activations (held after its
    forward: outputs and tensors saved for backward) and peak (the step's memory while it ran)."""


def reset_cuda_peak(device: Any) -> None:
    import torch

    torch.cuda.reset_peak_memory_stats(device)


def read_cuda_peak(device: Any) -> MemoryReading:
    import torch

    return MemoryReading(
        peak_bytes=int(torch.cuda.max_memory_allocated(device)),
        method="CUDA caching allocator: max_memory_allocated over the timed window",
    )


def _mem_tracker_class() -> Any:
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as exc:
        raise MemoryTrackerUnavailable(
            f"torch.distributed._tools.mem_tracker.MemTracker is not importable in torch ({exc}); "
            "CPU peak memory needs it — pin torch to a version that has it or run on CUDA"
        ) from None
    return MemTracker


def track_step_memory(
    model: Any, optimizer: Any, run_step: Callable[[], Any], *, round_bytes: Callable[[int], int] | None = None
) -> MemoryReading:
    """Run one step under MemTracker and return its peak, split by category and by module.

    `round_bytes` maps a storage's size to what the allocator would really hand out (the
    estimator's CUDA caching-allocator model); None counts exact bytes, as the CPU allocator does.
    """
    tracker = _mem_tracker_class()()
    try:
        _skip_grad_hooks_on_frozen(tracker, model)
        with _allocation_rounding(round_bytes):  # before track_external: parameters are sized there
            tracker.track_external(model, optimizer)
            with tracker, warnings.catch_warnings():
                # MemTracker's global module hooks make a compiled module warn that hooks fire twice;
                # harmless here: memory is attributed per tensor, not per hook call.
                warnings.filterwarnings("ignore", message=".*global hooks on modules.*", category=UserWarning)
                run_step()
        snapshot = tracker.get_tracker_snapshot("peak")
        modules = _module_breakdown(tracker)
    except (AttributeError, TypeError, KeyError) as exc:
        raise MemoryTrackerUnavailable(
            f"PyTorch's MemTracker API changed ({type(exc).__name__}: {exc}); update workbench/measure/memory.py"
        ) from None
    reading = _reading_from_snapshot(snapshot)
    reading.modules = modules
    return reading


class _NoHook:
    """Stands in for the gradient-hook handles MemTracker keeps per parameter (it calls `remove()`)."""

    def remove(self) -> None:
        pass


def _skip_grad_hooks_on_frozen(tracker: Any, model: Any) -> None:
    """Frozen parameters (a frozen backbone, LoRA) are counted as parameters, with no gradient.

    MemTracker registers a gradient hook on every parameter it meets, which raises for one that
    does not require grad; marking those as already hooked makes it skip just the hook.
    """
    handles = tracker._param_to_grad_hook_handles
    for param in model.parameters():
        if not param.requires_grad:
            handles[param] = (_NoHook(), _NoHook())


@contextlib.contextmanager
def _allocation_rounding(round_bytes: Callable[[int], int] | None) -> Iterator[None]:
    """Make MemTracker size each storage as `round_bytes(nbytes)` (its own rule rounds only real CUDA)."""
    if round_bytes is None:
        yield
        return
    try:
        from torch.distributed._tools.mem_tracker import _WeakRefInfo
    except ImportError as exc:
        raise MemoryTrackerUnavailable(f"MemTracker's _WeakRefInfo moved ({exc}); update memory.py") from None
    original = _WeakRefInfo._calculate_mem_consumed

    def rounded(self: Any) -> int:
        return round_bytes(int(self.size * self.element_size))

    _WeakRefInfo._calculate_mem_consumed = rounded  # type: ignore[method-assign]
    try:
        yield
    finally:
        _WeakRefInfo._calculate_mem_consumed = original  # type: ignore[method-assign]


def _module_breakdown(tracker: Any) -> dict[str, dict[str, int]]:
    """Per module from MemTracker's snapshots; names relative to the model (its root is '')."""
    out: dict[str, dict[str, int]] = {}
    stats = list(tracker.memory_tracking.values())
    root = min((s.mod_fqn for s in stats), key=len, default="")
    for stat in stats:
        name = "" if stat.mod_fqn == root else stat.mod_fqn[len(root) + 1 :]
        before = _first_cpu_or_any(stat.snapshots, "Pre-Forward")
        after = _first_cpu_or_any(stat.snapshots, "Post-Forward")
        activations = _category(after, "Activation") - _category(before, "Activation")
        out[name] = {
            "parameters": int(stat.parameter_mem),
            "activations": max(0, int(activations)),
            "peak": int(max(stat.local_peak.values(), default=0)),
        }
    return out


def _first_cpu_or_any(snapshots: dict[Any, list[dict[Any, dict[Any, int]]]], state: str) -> dict[Any, int]:
    for key, values in snapshots.items():
        if getattr(key, "value", key) == state and values:
            per_device = values[0]
            return next(iter(per_device.values()), {})
    return {}


def _category(snapshot: dict[Any, int], name: str) -> int:
    return sum(int(v) for k, v in snapshot.items() if getattr(k, "value", k) == name)


def _reading_from_snapshot(snapshot: dict[Any, dict[Any, int]]) -> MemoryReading:
    total = 0
    breakdown: dict[str, int] = {}
    # The step's device: an accelerator when one was tracked (host-side batch copies stay out), else the CPU.
    wanted = next((str(d) for d in snapshot if str(d) != "cpu"), "cpu")
    for device, categories in snapshot.items():
        if str(device) != wanted:
            continue
        for key, value in categories.items():
            name = getattr(key, "value", key)
            if name == "Total":
                total += int(value)
            else:
                label = _CATEGORIES.get(str(name), str(name).lower())
                breakdown[label] = breakdown.get(label, 0) + int(value)
    return MemoryReading(
        peak_bytes=total,
        method="tensor tracker (PyTorch MemTracker) on one extra step after the timed window",
        breakdown=breakdown,
    )


# --- tensors held for backward --------------------------------------------------------------


def saved_for_backward_bytes(output: Any, exclude: Any = ()) -> int:
    """Bytes of the distinct storages the autograd graph behind `output` holds for backward.

    The activation memory a step keeps between its forward and its backward, read off the graph
    itself (built-in nodes' `_saved_*` tensors and custom/compiled functions' `saved_tensors`), so
    it also sees inside a compiled region, where MemTracker's dispatch-level view cannot.
    `exclude` (e.g. the model's parameters) are left out: saved, but not activations.
    """
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}
    seen: set[Any] = set()
    stack = [getattr(output, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for tensor in _saved_tensors(node):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in skip:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        stack.extend(next_node for next_node, _ in node.next_functions)
    return sum(storages.values())


def _saved_tensors(node: Any) -> list[Any]:
    found: list[Any] = []
    try:  # custom autograd.Function nodes, AOTAutograd's compiled function among them
        found.extend(node.saved_tensors)
    except (AttributeError, RuntimeError):
        pass
    for name in dir(node):
        if name.startswith("_saved_"):
            found.append(getattr(node, name, None))
    return found
