"""Peak training memory, measured the way each device allows.

CUDA: the caching allocator's peak over the timed window (`max_memory_allocated`).
CPU: process RSS cannot see activation memory come and go (glibc keeps freed pages),
so one extra step after the timed window runs under PyTorch's tensor-level
MemTracker, which also splits the peak by category. MemTracker is a private API
(`torch.distributed._tools`): this is the one module that touches it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
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


def track_step_memory(model: Any, optimizer: Any, run_step: Callable[[], Any]) -> MemoryReading:
    """Run one step under MemTracker and return its peak, split by category."""
    tracker = _mem_tracker_class()()
    try:
        tracker.track_external(model, optimizer)
        with tracker, warnings.catch_warnings():
            # MemTracker's global module hooks make a compiled module warn that hooks fire twice;
            # harmless here: memory is attributed per tensor, not per hook call.
            warnings.filterwarnings("ignore", message=".*global hooks on modules.*", category=UserWarning)
            run_step()
        snapshot = tracker.get_tracker_snapshot("peak")
    except (AttributeError, TypeError) as exc:
        raise MemoryTrackerUnavailable(
            f"PyTorch's MemTracker API changed ({type(exc).__name__}: {exc}); update workbench/measure/memory.py"
        ) from None
    return _reading_from_snapshot(snapshot)


def _reading_from_snapshot(snapshot: dict[Any, dict[Any, int]]) -> MemoryReading:
    total = 0
    breakdown: dict[str, int] = {}
    for device, categories in snapshot.items():
        if str(device) != "cpu":
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
