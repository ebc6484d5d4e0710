"""The one timed-window loop: synchronized warm-up steps, then the timed steady state.

Every path that measures steps runs this loop — the inline trial (so the worker too), each
torchrun rank, and the paired session's blocks (`one_step`). What differs between them is
passed in: where the loss goes (`LossLog`; a rank's averages it over the world first), how a
rank reports its position (`on_phase`), how a caller cancels (`check`).

Warm-up steps (and the compile or CUDA-graph capture they trigger) are host-timed one at a
time and never enter the step statistics. The timed window follows `timing.py`'s rules: no
host synchronization per step; CUDA events are read as they complete. On CUDA the peak
memory is read right after the timed window, before anything else runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from workbench.measure.events import EventSink, StepMeasured
from workbench.measure.memory import read_cuda_peak, reset_cuda_peak
from workbench.measure.nvtx import step_ranges
from workbench.measure.result import TrialResult
from workbench.measure.timing import make_clock, synchronize
from workbench.measure.utilization import WindowProbe

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

Phase = Callable[[int, str], None]
"""`on_phase(step, label)`: called at each phase boundary of a step (a rank's progress report)."""


def run_window(
    train_step: TrainStep,
    batches: Iterator[Any],
    result: TrialResult,
    emit: EventSink,
    losses: LossLog,
    *,
    check: Callable[[], None] | None = None,
    on_phase: Phase | None = None,
) -> None:
    """Warm up, then time `result.steps` steps into `result`; a non-finite loss ends it as 'diverged'."""
    dev, config = train_step.device, train_step.config
    check = check or (lambda: None)
    capture = dev.type == "cuda" and config.cuda_graphs
    if capture:  # the graph's private pool is allocated at capture, during warm-up; replays allocate nothing
        reset_cuda_peak(dev)
    for index in range(result.warmup):
        check()
        begin = time.perf_counter()
        one_step(train_step, batches, clock=None, losses=losses, index=index, on_phase=on_phase)
        synchronize(dev)
        elapsed_ms = (time.perf_counter() - begin) * 1000.0
        result.warmup_step_ms.append(elapsed_ms)
        value = losses.peek(index)
        emit(StepMeasured(result.trial_id, index, False, elapsed_ms, value))
        if value is not None and not math.isfinite(value):
            return mark_diverged(result, losses, index)
    result.time_to_first_step_s = result.warmup_step_ms[0] / 1000.0
    capture_peak = read_cuda_peak(dev).peak_bytes if capture else None
    if dev.type == "cuda":
        reset_cuda_peak(dev)

    clock = make_clock(dev)
    probe = WindowProbe(dev)  # opened before the window: NVML's start-up is not the trial's
    probe.start()
    try:
        for offset in range(result.steps):
            check()
            index = result.warmup + offset
            one_step(train_step, batches, clock=clock, losses=losses, index=index, on_phase=on_phase)
            for timing in clock.poll():
                _record_timed(result, losses, timing, emit)
            if dev.type == "cpu" and not math.isfinite(losses.values[index] or 0.0):
                break
        for timing in clock.finish():
            _record_timed(result, losses, timing, emit)
    except BaseException:
        probe.abandon()
        raise
    probe.stop(len(result.step_ms), result.samples_per_step)
    result.timed_window = list(probe.window) if probe.window else None
    result.utilization, result.energy = probe.utilization, probe.energy
    if dev.type == "cuda":
        _record_cuda_peak(result, dev, capture_peak)
    result.losses = losses.finalize()
    bad = next((i for i, x in enumerate(result.losses) if not math.isfinite(x)), None)
    if bad is not None:
        return mark_diverged(result, losses, bad)
    median = result.median_step_ms or 0.0
    one_time = config.compile != "off" or config.cuda_graphs
    result.compile_time_s = max(0.0, result.warmup_step_ms[0] - median) / 1000.0 if one_time else 0.0


def one_step(
    train_step: TrainStep,
    batches: Iterator[Any],
    clock: Any = None,
    losses: LossLog | None = None,
    index: int = 0,
    on_phase: Phase | None = None,
) -> Any:
    """One training step: `grad_accumulation` micro-batches, each phase boundary marked on `clock`."""

    nvtx = step_ranges(train_step, index)  # None off CUDA

    def mark(label: str) -> None:
        if clock is not None:
            clock.mark(label)
        if on_phase is not None:
            on_phase(index, label)
        if nvtx is not None:
            nvtx.mark(label)

    if on_phase is not None:
        on_phase(index, "data")
    if nvtx is not None:
        nvtx.begin()
    if clock is not None:
        clock.begin_step()
    micro = [train_step.prepare_batch(next(batches)) for _ in range(train_step.config.grad_accumulation)]
    if clock is not None:
        clock.mark("data")
    if nvtx is not None:
        nvtx.mark("data")
    marking = clock is not None or on_phase is not None or nvtx is not None
    loss = train_step(micro, mark if marking else None)
    if clock is not None:
        clock.end_step()
    if nvtx is not None:
        nvtx.end()
    if losses is not None:  # after the clock stopped: a rank's collective never enters a step time
        losses.record(index, loss)
    return loss


def mark_diverged(result: TrialResult, losses: LossLog, step: int) -> None:
    result.losses = losses.finalize()
    result.status = "diverged"
    result.diverged_step = step
    result.message = f"loss became {result.losses[step]} at step {step}; lower lr, or use bf16 instead of fp16"


def _record_timed(result: TrialResult, losses: LossLog, timing: Any, emit: EventSink) -> None:
    index = result.warmup + len(result.step_ms)
    result.step_ms.append(timing.step_ms)
    for name, value in timing.phase_ms.items():
        result.phase_ms.setdefault(name, []).append(value)
    emit(StepMeasured(result.trial_id, index, True, timing.step_ms, losses.peek(index), dict(timing.phase_ms)))


def _record_cuda_peak(result: TrialResult, device: Any, capture_peak: int | None) -> None:
    window_peak = read_cuda_peak(device).peak_bytes or 0
    if capture_peak is None:
        result.peak_memory_bytes = window_peak
        result.memory_method = "CUDA caching allocator: max_memory_allocated over the timed window"
        return
    result.peak_memory_bytes = max(window_peak, capture_peak)
    result.memory_method = (
        "CUDA caching allocator: max_memory_allocated, the larger of warm-up with the CUDA-graph capture "
        f"({capture_peak} B) and the timed window ({window_peak} B): replays allocate nothing, their "
        "activations live in the pool allocated at capture"
    )


class LossLog:
    """Per-step losses without a host sync on CUDA: each loss is copied into pinned host memory,
    with an event behind the copy so `peek` knows when the value has landed.

    `reduce` (a rank's mean over the world) turns the local loss into the one recorded."""

    def __init__(self, device: Any, warmup: int, steps: int, reduce: Callable[[Any], Any] | None = None) -> None:
        import torch

        self._cuda = device.type == "cuda"
        self._reduce = reduce
        self.values: list[float | None] = [None] * (warmup + steps)
        self._recorded = 0
        self._host = torch.empty(warmup + steps, pin_memory=True) if self._cuda else None
        self._landed: dict[int, Any] = {}

    def record(self, index: int, loss: Any) -> float | None:
        self._recorded = max(self._recorded, index + 1)
        loss = loss.detach().float()
        if self._reduce is not None:
            loss = self._reduce(loss)
        if self._cuda:
            assert self._host is not None
            import torch

            self._host[index].copy_(loss, non_blocking=True)
            self._landed[index] = torch.cuda.Event()
            self._landed[index].record()
            return None
        value = float(loss)
        self.values[index] = value
        return value

    def peek(self, index: int) -> float | None:
        """The loss if it is already on the host (on CUDA: once its copy completed; None before)."""
        if self._cuda:
            assert self._host is not None
            landed = self._landed.get(index)
            return float(self._host[index]) if landed is not None and landed.query() else None
        return self.values[index]

    def finalize(self) -> list[float]:
        if self._cuda:
            assert self._host is not None
            import torch

            torch.cuda.synchronize()
            return [float(x) for x in self._host.tolist()[: self._recorded]]
        return [x for x in self.values[: self._recorded] if x is not None]
