"""`run_trial`: one measured training window — warm up, time the steady state, read memory.

Warm-up steps (and the compile or CUDA-graph capture they trigger) are timed apart
and never enter the step statistics. The timed window follows `timing.py`'s rules;
memory is read per `memory.py`. Input errors (bad config, unknown workload) raise;
failures of the training itself become a result with a status, so callers can
keep going.
"""

from __future__ import annotations

import math
import os
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from workbench.config import ConfigError, TrainConfig
from workbench.measure.compile_cache import cache_counts, cache_state
from workbench.measure.events import EventSink, StepMeasured, TrialFinished, TrialStarted
from workbench.measure.memory import MemoryReading, read_cuda_peak, reset_cuda_peak, track_step_memory
from workbench.measure.profile import ProfileOptions
from workbench.measure.result import TrialResult
from workbench.measure.timing import make_clock, synchronize
from workbench.workloads import Workload, WorkloadError, load_workload

if TYPE_CHECKING:
    from workbench.optimizations.build import TrainStep


class TrialCancelled(Exception):
    """Raised inside the loop when the caller's cancel event is set."""


Isolation = Literal["process", "inline"]


def run_trial(
    workload: Workload | str,
    config: TrainConfig | None = None,
    *,
    warmup: int = 3,
    steps: int = 20,
    device: Any = None,
    preset: str = "tiny",
    on_event: EventSink | None = None,
    track_memory: bool = True,
    cancel: threading.Event | None = None,
    isolation: Isolation = "process",
    timeout_s: float | None = None,
    memory_limit_bytes: int | None = None,
    profile: bool | ProfileOptions = False,
) -> TrialResult:
    """Measure `steps` training steps of `workload` under `config`, after `warmup` untimed steps.

    `workload` is a Workload, a built-in name or a 'package.module:attr' spec (built with
    `preset` and `config.extra` as options). Events go to `on_event` as they happen.

    isolation='process' (default) runs the trial in a fresh spawned worker: a crash, an
    out-of-memory, a hang (no event for `timeout_s`) or `cancel.set()` ends the worker, never
    the caller, and each trial starts with a clean allocator and in-memory compile caches (Inductor's
    disk cache is shared: `result.compile_cache` says cold or warm, see `compile_cache.py`). 'inline'
    runs in this process, for debugging; it cannot enforce `timeout_s` or a memory limit.
    `memory_limit_bytes` caps the worker's address space (CPU out-of-memory → status 'oom').
    `profile=True` (or `ProfileOptions`) adds a torch.profiler window *after* the timed window
    (its figures never touch the step statistics): trace file, top operators, phase shares,
    overhead figures and host-sync sites land in `result.profile`.
    """
    config = config or TrainConfig()
    _check_window(warmup, steps)
    profile_options = ProfileOptions.coerce(profile)
    if config.strategy != "none":
        return _run_distributed(
            workload, config, warmup=warmup, steps=steps, device=device, preset=preset, on_event=on_event,
            cancel=cancel, isolation=isolation, timeout_s=timeout_s, memory_limit_bytes=memory_limit_bytes,
            profile=profile_options,
        )  # fmt: skip
    if isolation == "process":
        from workbench.measure.worker import run_in_worker

        return run_in_worker(
            workload, config, warmup=warmup, steps=steps, device=device, preset=preset, on_event=on_event,
            track_memory=track_memory, cancel=cancel, timeout_s=timeout_s, memory_limit_bytes=memory_limit_bytes,
            profile=profile_options,
        )  # fmt: skip
    if isolation != "inline":
        raise ConfigError(f"isolation must be 'process' or 'inline', got {isolation!r}")
    if timeout_s is not None or memory_limit_bytes is not None:
        raise ConfigError("timeout_s and memory_limit_bytes need isolation='process' (a thread cannot be killed)")
    return run_trial_inline(
        workload, config, warmup=warmup, steps=steps, device=device, preset=preset, on_event=on_event,
        track_memory=track_memory, cancel=cancel, profile=profile_options,
    )  # fmt: skip


def _run_distributed(
    workload: Workload | str, config: TrainConfig, *, isolation: str, profile: Any, **options: Any
) -> TrialResult:
    """strategy=ddp/fsdp2: torchrun processes (`workbench.distributed`), always isolated from the caller."""
    if isolation != "process":
        raise ConfigError(
            f"strategy={config.strategy} always runs in torchrun processes; isolation='inline' is for "
            "single-process debugging (set strategy=none, or isolation='process')"
        )
    if profile is not None:
        raise ConfigError(
            f"profile is not available with strategy={config.strategy} yet; a distributed trial always "
            "profiles a short window itself (compute vs communication in result.distributed)"
        )
    from workbench.distributed import run_distributed_trial

    return run_distributed_trial(workload, config, **options)


def run_trial_inline(
    workload: Workload | str,
    config: TrainConfig,
    *,
    warmup: int,
    steps: int,
    device: Any,
    preset: str,
    on_event: EventSink | None,
    track_memory: bool,
    cancel: threading.Event | None,
    profile: ProfileOptions | dict[str, Any] | None = None,
) -> TrialResult:
    """The trial itself, in this process (the worker process calls this too)."""
    import torch

    from workbench.device import capabilities_report, check_config, device_info, resolve_device
    from workbench.fingerprint import environment_fingerprint
    from workbench.optimizations.build import build

    wl = load_workload(workload, preset=preset, **config.extra) if isinstance(workload, str) else workload
    dev = resolve_device(device)
    check_config(config, dev)
    emit = on_event or (lambda event: None)

    result = TrialResult(
        trial_id=uuid.uuid4().hex[:12],
        status="ok",
        workload=wl.name,
        preset=wl.preset,
        workload_source=wl.source,
        config=config.to_dict(),
        device=device_info(dev).to_dict(),
        environment=environment_fingerprint(dev),
        capabilities=capabilities_report(dev)["toggles"],
        warmup=warmup,
        steps=steps,
        batch_size=wl.effective_batch_size(config),
        started_at=time.time(),
        worker_pid=os.getpid(),
    )
    emit(TrialStarted(result.trial_id, wl.describe(), result.config, warmup, steps, str(dev)))
    started = time.perf_counter()
    try:
        _check_cancel(cancel)
        cache_before = cache_counts() if config.compile != "off" else None
        train_step = build(wl, config, dev)
        result.applied = [{"toggle": a.toggle, "value": a.value, "detail": a.detail} for a in train_step.applied]
        _run_window(train_step, wl, config, result, emit, cancel, track_memory, ProfileOptions.coerce(profile))
        result.compile_cache = cache_state(cache_before) if cache_before is not None else None
    except (ConfigError, WorkloadError):
        raise
    except TrialCancelled:
        result.status, result.message = "cancelled", "cancelled by the caller"
    except torch.OutOfMemoryError as exc:
        result.status, result.message = "oom", f"out of memory: {str(exc).splitlines()[0]}"
    except MemoryError:
        result.status, result.message = "oom", "out of host memory (MemoryError)"
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            result.status, result.message = "error", _error_text(exc)
        else:  # the CPU allocator's out-of-memory is a plain RuntimeError
            result.status, result.message = "oom", f"out of host memory: {str(exc).splitlines()[0]}"
    except Exception as exc:  # the user's model may raise anything; report it, keep the caller alive
        result.status, result.message = "error", _error_text(exc)
    result.wall_time_s = time.perf_counter() - started
    emit(TrialFinished(result.trial_id, result))
    return result


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"


def _check_window(warmup: int, steps: int) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ConfigError(f"warmup must be an integer >= 1 (the first step carries one-time costs), got {warmup!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps must be an integer >= 1, got {steps!r}")


def _run_window(
    train_step: TrainStep,
    workload: Workload,
    config: TrainConfig,
    result: TrialResult,
    emit: EventSink,
    cancel: threading.Event | None,
    track_memory: bool,
    profile: ProfileOptions | None = None,
) -> None:
    dev = train_step.device
    batches = workload.batches(config)
    losses = _LossLog(dev, warmup=result.warmup, steps=result.steps)

    # Warm-up: one step at a time, synchronized, timed by the host clock (it includes compile/capture).
    for index in range(result.warmup):
        _check_cancel(cancel)
        begin = time.perf_counter()
        one_step(train_step, batches, config, clock=None, losses=losses, index=index)
        synchronize(dev)
        elapsed_ms = (time.perf_counter() - begin) * 1000.0
        result.warmup_step_ms.append(elapsed_ms)
        value = losses.peek(index)
        if index == 0:
            result.samples_per_step = _samples_per_step(workload, config)
        emit(StepMeasured(result.trial_id, index, False, elapsed_ms, value))
        if value is not None and not math.isfinite(value):
            return _mark_diverged(result, losses, index)
    result.time_to_first_step_s = result.warmup_step_ms[0] / 1000.0

    # Timed window: no host synchronization per step (CUDA events are read as they complete).
    if dev.type == "cuda":
        reset_cuda_peak(dev)
    clock = make_clock(dev)
    for offset in range(result.steps):
        _check_cancel(cancel)
        one_step(train_step, batches, config, clock=clock, losses=losses, index=result.warmup + offset)
        for timing in clock.poll():
            _record_timed(result, losses, timing, emit)
        if dev.type == "cpu" and not math.isfinite(losses.values[result.warmup + offset] or 0.0):
            break
    for timing in clock.finish():
        _record_timed(result, losses, timing, emit)
    result.losses = losses.finalize()
    bad = next((i for i, x in enumerate(result.losses) if not math.isfinite(x)), None)
    if bad is not None:
        return _mark_diverged(result, losses, bad)

    median = result.median_step_ms or 0.0
    one_time = config.compile != "off" or config.cuda_graphs
    result.compile_time_s = max(0.0, result.warmup_step_ms[0] - median) / 1000.0 if one_time else 0.0
    reading = _read_memory(train_step, batches, config) if dev.type == "cuda" or track_memory else None
    if reading is not None:
        result.peak_memory_bytes, result.memory_method, result.memory_breakdown = (
            reading.peak_bytes,
            reading.method,
            reading.breakdown,
        )
        result.memory_modules = reading.modules
    if profile is not None and result.status == "ok":
        _check_cancel(cancel)
        _profile_after_window(train_step, batches, config, result, profile)


def one_step(
    train_step: TrainStep,
    batches: Iterator[Any],
    config: TrainConfig,
    clock: Any,
    losses: _LossLog | None = None,
    index: int = 0,
) -> Any:
    if clock is not None:
        clock.begin_step()
    micro = [train_step.prepare_batch(next(batches)) for _ in range(config.grad_accumulation)]
    if clock is not None:
        clock.mark("data")
    loss = train_step(micro, clock.mark if clock is not None else None)
    if losses is not None:
        losses.record(index, loss)
    if clock is not None:
        clock.end_step()
    return loss


def _record_timed(result: TrialResult, losses: _LossLog, timing: Any, emit: EventSink) -> None:
    index = result.warmup + len(result.step_ms)
    result.step_ms.append(timing.step_ms)
    for name, value in timing.phase_ms.items():
        result.phase_ms.setdefault(name, []).append(value)
    emit(StepMeasured(result.trial_id, index, True, timing.step_ms, losses.peek(index), dict(timing.phase_ms)))


def _read_memory(train_step: TrainStep, batches: Iterator[Any], config: TrainConfig) -> MemoryReading:
    dev = train_step.device
    if dev.type == "cuda":
        return read_cuda_peak(dev)
    if config.compile != "off" and config.compile_backend == "inductor":
        # Inductor's generated CPU code allocates its buffers outside the dispatcher, where the
        # tensor tracker cannot see them: a figure would be too low, so report none.
        return MemoryReading(None, "not measured: inductor-compiled CPU code allocates outside the tensor tracker")
    if config.grad_accumulation > 1:
        # MemTracker raises NotImplementedError when a module runs forward more than once per step.
        return MemoryReading(
            None,
            "not measured: the CPU tensor tracker cannot follow several micro-batches a step (grad_accumulation > 1)",
        )

    def extra_step() -> None:
        one_step(train_step, batches, config, clock=None)

    try:
        return track_step_memory(train_step.model, train_step.optimizer, extra_step)
    except Exception as exc:  # an optional reading: its failure must not discard the measured steps
        return MemoryReading(None, f"not measured: the CPU tensor tracker failed ({type(exc).__name__}: {exc})")


def _profile_after_window(
    train_step: TrainStep, batches: Iterator[Any], config: TrainConfig, result: TrialResult, options: ProfileOptions
) -> None:
    """The profiled window, after everything timed. On CUDA one more step runs under the tensor
    tracker for the per-category and per-module split (the allocator's peak stays the figure)."""
    from workbench.measure.profile import profile_window

    if train_step.device.type == "cuda" and config.compile == "off" and not config.cuda_graphs:
        reading = track_step_memory(
            train_step.model, train_step.optimizer, lambda: one_step(train_step, batches, config, clock=None)
        )
        result.memory_breakdown, result.memory_modules = reading.breakdown, reading.modules
    result.profile = profile_window(train_step, batches, config, options, result.trial_id).to_dict()


def _samples_per_step(workload: Workload, config: TrainConfig) -> int:
    return workload.effective_batch_size(config) * config.grad_accumulation


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise TrialCancelled


def _mark_diverged(result: TrialResult, losses: _LossLog, step: int) -> None:
    result.losses = losses.finalize()
    result.status = "diverged"
    result.diverged_step = step
    result.message = f"loss became {result.losses[step]} at step {step}; lower lr, or use bf16 instead of fp16"


class _LossLog:
    """Per-step losses without a host sync on CUDA: each loss is copied into pinned host memory."""

    def __init__(self, device: Any, warmup: int, steps: int) -> None:
        import torch

        self._cuda = device.type == "cuda"
        self.values: list[float | None] = [None] * (warmup + steps)
        self._recorded = 0
        self._host = torch.empty(warmup + steps, pin_memory=True) if self._cuda else None

    def record(self, index: int, loss: Any) -> float | None:
        self._recorded = max(self._recorded, index + 1)
        if self._cuda:
            assert self._host is not None
            self._host[index].copy_(loss.detach().float(), non_blocking=True)
            return None
        value = float(loss.detach().float())
        self.values[index] = value
        return value

    def peek(self, index: int) -> float | None:
        """The loss if it is already on the host (on CUDA: valid once the step's end event completed)."""
        if self._cuda:
            assert self._host is not None
            return float(self._host[index])
        return self.values[index]

    def finalize(self) -> list[float]:
        if self._cuda:
            assert self._host is not None
            import torch

            torch.cuda.synchronize()
            return [float(x) for x in self._host.tolist()[: self._recorded]]
        return [x for x in self.values[: self._recorded] if x is not None]
