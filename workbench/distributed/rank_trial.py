"""The rank side of a distributed trial: every rank trains its shard; rank 0 reports for all.

The window is the single-process one (`measure.window.run_window`). What a rank adds: the
loss is averaged over ranks after each step's clock stops (so the result is the global
batch's loss, and the collective never enters a step time); each phase boundary reports the
rank's position (so a hang is pinned on a rank); every rank's step times and peak memory are
gathered at the end, so a straggler shows; then a short profiled window measures compute vs
communication, and a small all-reduce benchmark the bandwidth actually reached.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workbench.distributed.collectives import CollectiveCounter
from workbench.distributed.overlap import comm_profile, intervals_from_events
from workbench.distributed.sharding import data_parallel_position, shard_workload
from workbench.distributed.stats import summarize_ranks
from workbench.levers.build import TrainStep, build
from workbench.levers.tensor_parallel import local_parameter_bytes
from workbench.measure.compile_report import CompileWatch
from workbench.measure.events import EventSink, TrialFinished, TrialStarted
from workbench.measure.outcome import start_result
from workbench.measure.request import TrialRequest
from workbench.measure.result import TrialResult
from workbench.measure.schedstat import ThreadSteps
from workbench.measure.syncwait import SyncWaits
from workbench.measure.timing import synchronize
from workbench.measure.window import LossLog, run_window
from workbench.workloads import load_workload

PROFILE_STEPS = 3
"""Steps in the profiled window: enough to average, short enough that the profiler's ~10% CPU
overhead (measured on these 2-core hosts) and its trace stay small."""
BANDWIDTH_ITERS = 5
BANDWIDTH_MAX_BYTES = 32 * 2**20
"""The bandwidth probe all-reduces the model's gradient size, capped here to stay quick."""

Progress = Callable[[int, str], None]
"""`progress(step, phase)`: a rank's position, reported so a hang can be pinned on a rank."""


@dataclass(frozen=True)
class RankContext:
    """Who this process is in the world torchrun built."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    @classmethod
    def from_env(cls, device_type: str) -> RankContext:
        rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local) if device_type == "cuda" else torch.device("cpu")
        return cls(rank, local, int(os.environ["WORLD_SIZE"]), device, "nccl" if device_type == "cuda" else "gloo")


def run_rank_trial(request: TrialRequest, ctx: RankContext, *, emit: EventSink, progress: Progress) -> TrialResult:
    """Run this rank's part of `request`; rank 0's result (with every rank's data) is the trial's result.

    A request the launcher resolved was checked on this node's device already; one from the
    command line (`export.to_command`, a cluster node) is checked here, when the model is built."""
    config, workload = request.config, request.workload
    wl = load_workload(workload, preset=request.preset, **config.extra) if isinstance(workload, str) else workload
    local_wl, local_config = shard_workload(wl, config, *data_parallel_position(config, ctx.rank, ctx.world_size))
    progress(-1, "setup")
    result = start_result(_shared_trial_id(ctx), request, wl, ctx.device)
    emit(TrialStarted(result.trial_id, wl.describe(), result.config, request.warmup, request.steps,
                      f"{ctx.world_size}x{ctx.device}"))  # fmt: skip
    progress(-1, "setup")  # each stretch of set-up reports, so only a real hang looks silent
    started = time.perf_counter()
    watch = CompileWatch() if config.compile != "off" else None  # a fresh process: its compiles are this trial's
    train_step = build(local_wl, local_config, ctx.device, checked=request.checked)
    result.applied = [{"toggle": a.toggle, "value": a.value, "detail": a.detail} for a in train_step.applied]
    batches = local_wl.batches(local_config)
    waits, queue = SyncWaits(train_step.model, ctx.device), ThreadSteps()
    losses = LossLog(ctx.device, request.warmup, request.steps, reduce=lambda loss: _world_mean(loss, ctx, waits))
    run_window(train_step, batches, result, emit, losses, on_phase=_noting_phases(progress, waits, queue))
    waits.close()
    if watch is not None:  # each rank compiles alike; rank 0's report is the one its result returns
        result.compile_report = watch.report().to_dict()
    local: dict[str, Any] = {"rank": ctx.rank, "host": socket.gethostname(), "step_ms": list(result.step_ms)}
    local["warmup_step_ms"] = list(result.warmup_step_ms)
    local["peak_memory_bytes"] = result.peak_memory_bytes
    local["phase_ms"] = {name: list(values) for name, values in result.phase_ms.items()}
    if waits.gradient_sync_seen:
        local["sync_wait_ms"] = waits.resolve()[result.warmup :]
        local["phase_wait_ms"] = {
            "forward": waits.resolve("forward")[result.warmup :],
            "backward": waits.resolve("gradient")[result.warmup :],
        }
    local["cpu"] = (result.utilization or {}).get("cpu")
    local["cpu_ms"] = queue.cpu_ms[result.warmup :]
    local["cpu_wait_ms"] = queue.cpu_wait_ms[result.warmup :]
    local["parameter_bytes"] = local_parameter_bytes(train_step.base_model)
    if result.status == "ok":
        local["collectives"] = count_collectives(train_step, batches, ctx, result.warmup + result.steps, progress)
        local["profile"] = profile_comm(train_step, batches, ctx, result.warmup + result.steps + 1, progress).to_dict()
        local["allreduce"] = measure_allreduce(_gradient_bytes(train_step), ctx)
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, local)
    result.rank_step_ms = [list(item["step_ms"]) for item in gathered]
    result.distributed = summarize_ranks(gathered, config, ctx.backend, ctx.world_size, _step_comm_bytes(train_step))
    result.distributed["tensor_parallel"] = config.tensor_parallel
    result.distributed["sequence_parallel"] = config.sequence_parallel
    _record_memory(result, gathered, ctx)
    result.wall_time_s = time.perf_counter() - started
    emit(TrialFinished(result.trial_id, result))
    return result


def _world_mean(loss: torch.Tensor, ctx: RankContext, waits: SyncWaits) -> torch.Tensor:
    """The global batch's loss: the mean of every rank's (the loss the ranks stop on together).

    It is the step's last synchronization: a rank late to it (a slow optimizer step) makes the
    others wait here, so the wait counts with the gradient sync's."""
    total = loss.clone()
    waits.timed(lambda: dist.all_reduce(total))
    waits.end_step()
    return total / ctx.world_size


def _noting_phases(progress: Progress, waits: SyncWaits, queue: ThreadSteps) -> Progress:
    """The rank's progress report, also telling `waits` when each backward returned and `queue`
    when each step's phases ended (its thread's time on a core, and waiting for one, per step)."""

    def on_phase(step: int, phase: str) -> None:
        if phase == "forward":
            waits.forward_returned()
        elif phase == "backward":
            waits.backward_returned()
        elif phase in ("optimizer", "step"):  # 'step': a CUDA-graph replay is one phase
            queue.step_ended()
        progress(step, phase)

    return on_phase


def count_collectives(
    step: TrainStep, batches: Any, ctx: RankContext, index: int, progress: Progress
) -> dict[str, dict[str, int]]:
    """The collectives one extra step issues on this rank, by kind: count and bytes."""
    micro = [step.prepare_batch(next(batches)) for _ in range(step.config.grad_accumulation)]
    with CollectiveCounter() as counter:
        step(micro)
    synchronize(ctx.device)
    progress(index, "profile")
    return counter.counts


def profile_comm(step: TrainStep, batches: Any, ctx: RankContext, first_index: int, progress: Progress) -> Any:
    """Compute vs communication over `PROFILE_STEPS` extra steps under torch.profiler (all ranks)."""
    from torch.profiler import ProfilerActivity, profile

    dev = ctx.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    synchronize(dev)
    dist.barrier()
    begin = time.perf_counter()
    with profile(activities=activities) as prof:
        for index in range(PROFILE_STEPS):
            micro = [step.prepare_batch(next(batches)) for _ in range(step.config.grad_accumulation)]
            step(micro)
            progress(first_index + index, "profile")
        synchronize(dev)
    window_ms = (time.perf_counter() - begin) * 1000.0
    compute, comm = intervals_from_events(prof.events(), dev.type)
    return comm_profile(compute, comm, window_ms, PROFILE_STEPS)


def measure_allreduce(nbytes: int, ctx: RankContext) -> dict[str, float]:
    """Time an all-reduce of `nbytes` (capped): the bandwidth this world reaches, nccl-tests style.

    algbw = bytes / time; busbw = algbw * 2(n-1)/n, the per-link rate a ring all-reduce needs,
    comparable across world sizes and with the interconnect's rated bandwidth.
    """
    size = max(4, min(nbytes, BANDWIDTH_MAX_BYTES))
    buffer = torch.ones(size // 4, device=ctx.device)
    dist.all_reduce(buffer)  # connect and warm up outside the timing
    synchronize(ctx.device)
    dist.barrier()
    begin = time.perf_counter()
    for _ in range(BANDWIDTH_ITERS):
        dist.all_reduce(buffer)
    synchronize(ctx.device)
    seconds = (time.perf_counter() - begin) / BANDWIDTH_ITERS
    algbw = size / seconds / 1e9
    ring = 2 * (ctx.world_size - 1) / ctx.world_size if ctx.world_size > 1 else 0.0
    return {"bytes": float(size), "time_ms": seconds * 1000.0, "algbw_gbps": algbw, "busbw_gbps": algbw * ring}


def _gradient_bytes(step: TrainStep) -> int:
    """Bytes of the full (unsharded) fp32 gradient: what one data-parallel step must reduce."""
    return sum(p.numel() * p.element_size() for p in step.base_model.parameters() if p.requires_grad)


def _step_comm_bytes(step: TrainStep) -> int | None:
    """Bytes DDP all-reduces per step (halved by a 16-bit hook); None for FSDP2, whose traffic
    (all-gathers and reduce-scatters per block) is not one all-reduce."""
    if step.config.strategy != "ddp":
        return None
    grads = _gradient_bytes(step)
    return grads // 2 if step.config.comm_hook != "none" else grads


def _record_memory(result: TrialResult, gathered: list[Any], ctx: RankContext) -> None:
    if ctx.device.type == "cuda":
        peaks = [item.get("peak_memory_bytes") or 0 for item in gathered]
        result.peak_memory_bytes = max(peaks)
        result.memory_method = f"{result.memory_method}; largest rank (read right after the timed window)"
    else:
        result.memory_method = (
            "not measured: the CPU tensor tracker runs one extra step in one process, "
            "which a distributed trial does not do"
        )


def _shared_trial_id(ctx: RankContext) -> str:
    """One id for all ranks: rank 0 draws it and broadcasts it."""
    holder = [uuid.uuid4().hex[:12] if ctx.rank == 0 else ""]
    dist.broadcast_object_list(holder, src=0)
    return str(holder[0])
