"""`run_trial_inline`: one measured trial in this process — build, run the window, read memory.

The window itself is `window.run_window` (shared with the torchrun ranks); this adds what a
single-process trial does around it: the result's identity, the CPU memory reading (one more
step under the tensor tracker), the optional profiled window, and turning the training's own
failures into a status so callers keep going. Input errors (bad config, unknown workload)
raise. Where a trial runs (here, a worker, torchrun) is decided above, in `workbench.trials`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError, TrainConfig
from workbench.measure.compile_cache import cache_counts, cache_state
from workbench.measure.compile_report import CompileReport, CompileWatch, fullgraph_failure, reset_compiler
from workbench.measure.compiled_kernels import kernel_ranges
from workbench.measure.data_stages import TimedFetches
from workbench.measure.events import EventSink, TrialFinished, TrialStarted
from workbench.measure.memory import track_step_memory
from workbench.measure.outcome import start_result, status_of
from workbench.measure.profile import ProfileOptions
from workbench.measure.request import TrialRequest
from workbench.measure.result import TrialResult
from workbench.measure.staged import batch_source
from workbench.measure.window import LossLog, one_step, run_window
from workbench.workloads import WorkloadError, load_workload

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


class TrialCancelled(Exception):
    """Raised inside the loop when the caller's cancel event is set."""


def run_trial_inline(
    request: TrialRequest, on_event: EventSink | None = None, cancel: threading.Event | None = None
) -> TrialResult:
    """The trial itself, in this process (the worker process calls this too)."""
    import torch

    from workbench.levers.build import build

    request = request.resolved()  # the caller's resolution is trusted; only a bare request is checked here
    config = request.config
    workload = request.workload
    wl = load_workload(workload, preset=request.preset, **config.extra) if isinstance(workload, str) else workload
    dev = request.torch_device()
    if dev.type == "cuda":
        # Capture streams, synchronize() and the capability probes act on the *current* device:
        # for cuda:N that must be N for the whole trial.
        torch.cuda.set_device(dev)
    emit = on_event or (lambda event: None)

    result = start_result(uuid.uuid4().hex[:12], request, wl, dev)
    emit(TrialStarted(result.trial_id, wl.describe(), result.config, request.warmup, request.steps, str(dev)))
    started = time.perf_counter()
    watch: CompileWatch | None = None
    report: CompileReport | None = None
    try:
        _check_cancel(cancel)
        cache_before = cache_counts() if config.compile != "off" else None
        if config.compile != "off":
            reset_compiler()  # the report and the compile time are this trial's, as in a fresh worker
            watch = CompileWatch()
        # A profiled compiled trial compiles its CPU kernels with profiler ranges, so the profile can list them.
        with kernel_ranges(request.profile is not None and config.compile != "off"):
            train_step = build(wl, config, dev, checked=True)
            result.applied = [{"toggle": a.toggle, "value": a.value, "detail": a.detail} for a in train_step.applied]
            batches = batch_source(wl, config, train_step, request.staged_batches, request.data_stages)
            losses = LossLog(dev, warmup=request.warmup, steps=request.steps)
            run_window(train_step, batches, result, emit, losses, check=lambda: _check_cancel(cancel))
            if isinstance(batches, TimedFetches) and result.status == "ok":
                result.data_stages = batches.summary(result)
            # The report is the trial's own steps: the extra steps after the window are the workbench's, and
            # the memory timeline's runs on one intra-op thread, a global-state guard inductor recompiles on.
            report = watch.report() if watch is not None else None
            if result.status == "ok":
                _read_host_memory(train_step, batches, result, request.track_memory)
            if request.profile is not None and result.status == "ok":
                _check_cancel(cancel)
                _profile_after_window(train_step, batches, config, result, request.profile)
        result.compile_cache = cache_state(cache_before) if cache_before is not None else None
    except (ConfigError, WorkloadError):
        raise
    except TrialCancelled:
        result.status, result.message = "cancelled", "cancelled by the caller"
    except Exception as exc:  # the user's model may raise anything; report it, keep the caller alive
        result.status, result.message = status_of(exc)
        refused = fullgraph_failure(exc) if config.compile_fullgraph else None
        if refused is not None:  # the break and its line, not dynamo's traceback
            result.message = refused
    if watch is not None:  # a trial that failed before its window ended is reported as far as it got
        result.compile_report = (report or watch.report()).to_dict()
    result.wall_time_s = time.perf_counter() - started
    emit(TrialFinished(result.trial_id, result))
    return result


def _read_host_memory(train_step: TrainStep, batches: Iterator[Any], result: TrialResult, track: bool) -> None:
    """The CPU peak, from one more step under the tensor tracker (the CUDA peak is the window's own)."""
    if train_step.device.type == "cuda" or not track:
        return
    config = train_step.config
    if config.compile != "off" and config.compile_backend == "inductor":
        # Inductor's generated CPU code allocates its buffers outside the dispatcher, where the
        # tensor tracker cannot see them: a figure would be too low, so report none.
        result.memory_method = "not measured: inductor-compiled CPU code allocates outside the tensor tracker"
        return
    if config.grad_accumulation > 1:
        # MemTracker raises NotImplementedError when a module runs forward more than once per step.
        result.memory_method = (
            "not measured: the CPU tensor tracker cannot follow several micro-batches a step (grad_accumulation > 1)"
        )
        return
    try:
        reading = track_step_memory(train_step.model, train_step.optimizer, lambda: one_step(train_step, batches))
    except Exception as exc:  # an optional reading: its failure must not discard the measured steps
        result.memory_method = f"not measured: the CPU tensor tracker failed ({type(exc).__name__}: {exc})"
        return
    result.peak_memory_bytes, result.memory_method = reading.peak_bytes, reading.method
    result.memory_breakdown, result.memory_modules = reading.breakdown, reading.modules


def _profile_after_window(
    train_step: TrainStep, batches: Iterator[Any], config: TrainConfig, result: TrialResult, options: ProfileOptions
) -> None:
    """The profiled window, after everything timed. On CUDA one more step runs under the tensor
    tracker for the per-category and per-module split (the allocator's peak stays the figure)."""
    from workbench.measure.profile import profile_window

    if train_step.device.type == "cuda" and config.compile == "off" and not config.cuda_graphs:
        reading = track_step_memory(train_step.model, train_step.optimizer, lambda: one_step(train_step, batches))
        result.memory_breakdown, result.memory_modules = reading.breakdown, reading.modules
    result.profile = profile_window(train_step, batches, config, options, result.trial_id).to_dict()


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise TrialCancelled
