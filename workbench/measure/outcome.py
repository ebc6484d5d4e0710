"""A trial's result as it starts, and the status a training failure maps to: written once, used by
the single-process trial (`trial.py`, so the worker too) and by every torchrun rank (`rank_trial.py`).

Why one place: the two paths must report the same identity, environment and batch figures, and
call the same exception 'oom' or 'error', or a distributed trial and a single one disagree.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import TYPE_CHECKING

from workbench.device import device_info
from workbench.fingerprint import environment_fingerprint
from workbench.levers import capabilities_report
from workbench.measure.request import TrialRequest
from workbench.measure.result import Status, TrialResult
from workbench.workloads.base import Workload

if TYPE_CHECKING:
    import torch


def start_result(trial_id: str, request: TrialRequest, workload: Workload, device: torch.device) -> TrialResult:
    """The result before any step ran: who, where, what environment, which window and batch."""
    config = request.config
    batch = workload.effective_batch_size(config)
    return TrialResult(
        trial_id=trial_id,
        status="ok",
        workload=workload.name,
        preset=workload.preset,
        workload_source=workload.source,
        config=config.to_dict(),
        device=device_info(device).to_dict(),
        environment=environment_fingerprint(device),
        capabilities=capabilities_report(device)["toggles"],
        warmup=request.warmup,
        steps=request.steps,
        batch_size=batch,
        samples_per_step=batch * config.grad_accumulation,
        started_at=time.time(),
        worker_pid=os.getpid(),
    )


def status_of(exc: BaseException) -> tuple[Status, str]:
    """(status, message) of an exception raised by training: 'oom' for the device's or the host's
    out-of-memory (the CPU allocator's is a plain RuntimeError), else 'error' with the traceback."""
    import torch

    first_line = (str(exc).splitlines() or [""])[0]
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom", f"out of memory: {first_line}"
    if isinstance(exc, MemoryError):
        return "oom", "out of host memory (MemoryError)"
    if "can't allocate memory" in str(exc):
        return "oom", f"out of host memory: {first_line}"
    return "error", f"{type(exc).__name__}: {exc}\n\n{_traceback(exc)}"


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
