"""`run_trial`: one measured trial, wherever it has to run.

Above `measure` and `distributed`, so neither imports the other's launcher: a config with
strategy ddp/fsdp2 goes to torchrun ranks (`distributed.run_distributed_trial`), anything else
to a fresh worker process (`measure.worker.run_in_worker`, the default) or this process
(`measure.trial.run_trial_inline`, for debugging). Each takes the same `TrialRequest`, resolved here.
"""

from __future__ import annotations

import threading
from typing import Any

from workbench.config import TrainConfig
from workbench.measure import EventSink, TrialRequest, TrialResult
from workbench.workloads import Workload


def run_trial(
    workload: Workload | str,
    config: TrainConfig | None = None,
    *,
    on_event: EventSink | None = None,
    cancel: threading.Event | None = None,
    **options: Any,
) -> TrialResult:
    """Measure `steps` training steps of `workload` under `config`, after `warmup` untimed steps.

    `workload` is a Workload, a built-in name or a 'package.module:attr' spec (built with
    `preset` and `config.extra` as options). Events go to `on_event` as they happen. The other
    options are `TrialRequest`'s fields: warmup=3, steps=20, device=None, preset='tiny',
    track_memory=True, isolation='process', timeout_s=None, memory_limit_bytes=None, profile=False,
    staged_batches=0 (N > 0: the ideal loader, N real batches staged on the device and cycled),
    data_stages=False (True: where each batch's time went, `result.data_stages`).

    isolation='process' (default) runs the trial in a fresh worker: a crash, an out-of-memory,
    a hang (no event for `timeout_s` once the trial started) or `cancel.set()` ends the worker,
    never the caller, and each trial starts with clean allocator and compile caches. 'inline'
    runs in this process, for debugging; it cannot enforce `timeout_s` or a memory limit.
    `memory_limit_bytes` caps the worker's address space (CPU out-of-memory → status 'oom').
    `profile=True` (or `ProfileOptions`) adds a torch.profiler window *after* the timed window
    (its figures never touch the step statistics): trace file, top operators, phase shares,
    overhead figures and host-sync sites land in `result.profile`.
    """
    return run_request(TrialRequest.of(workload, config, **options), on_event, cancel)


def run_request(
    request: TrialRequest, on_event: EventSink | None = None, cancel: threading.Event | None = None
) -> TrialResult:
    """`run_trial` for a request already built (the protocol's rounds, the app).

    The request is resolved here, once (device settled, config checked on it); every path below
    trusts that and checks nothing again."""
    request = request.resolved()
    if request.config.launches_ranks:
        from workbench.distributed import run_distributed_trial

        return run_distributed_trial(request, on_event, cancel)
    if request.isolation == "process":
        from workbench.measure.worker import run_in_worker

        return run_in_worker(request, on_event, cancel)
    from workbench.measure.trial import run_trial_inline

    return run_trial_inline(request, on_event, cancel)
