"""Run a trial in a fresh worker process and stream its events back.

Why a process per trial: a crash, an out-of-memory or a hang in the user's model must
end the worker, never the notebook kernel; and every trial must start with clean
allocator and compile caches, so memory and compile figures are honest. The worker is a
fresh interpreter (`measure.child`), so any script works, guarded by `__main__` or not.
Workloads travel with cloudpickle (so a class defined in a notebook cell works); built-ins
and 'module:attr' specs are rebuilt by name in the worker.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.measure.events import EventSink, StepMeasured, TrialFinished, TrialStarted
from workbench.measure.result import TrialResult
from workbench.workloads.base import Workload, WorkloadError

#: How often the parent looks at the pipe, the cancel flag and the clock.
POLL_S = 0.05
STARTUP_GRACE_S = 60.0
"""Added to `timeout_s` until the trial has started: a fresh interpreter, `import torch` and the
workload's import take 3-30 s on a busy machine, and must not count as a hang."""
_INPUT_ERRORS = {"ConfigError": ConfigError, "WorkloadError": WorkloadError}


def run_in_worker(
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
    timeout_s: float | None,
    memory_limit_bytes: int | None,
    profile: Any = None,
) -> TrialResult:
    """`run_trial(isolation='process')`: the parent side."""
    from workbench.device import check_config, device_info, resolve_device

    if timeout_s is not None and not timeout_s > 0:
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if memory_limit_bytes is not None and (not isinstance(memory_limit_bytes, int) or memory_limit_bytes <= 0):
        raise ConfigError(f"memory_limit_bytes must be a positive integer, got {memory_limit_bytes!r}")
    dev = resolve_device(device)
    check_config(config, dev)  # refuse bad input here, before paying for a process
    payload = _payload(workload, preset, config)
    options = {"warmup": warmup, "steps": steps, "device": str(dev), "preset": preset, "track_memory": track_memory}
    if profile is not None:  # ProfileOptions travels as a dict of plain values
        options["profile"] = profile.to_dict()

    from workbench.measure.child import ChildProcess

    # The `finally` below ends the worker (and the DataLoader workers it started) whatever happens.
    child = ChildProcess(_worker_main, payload, config.to_dict(), options, memory_limit_bytes=memory_limit_bytes)
    try:
        return _follow(child, child.inbox, on_event, cancel, timeout_s, workload_name(workload), config,
                       device=device_info(dev).to_dict())  # fmt: skip
    finally:
        child.stop()


def workload_name(workload: Workload | str) -> str:
    return workload if isinstance(workload, str) else workload.name


def _payload(workload: Workload | str, preset: str, config: TrainConfig) -> bytes:
    if isinstance(workload, str):
        from workbench.workloads import load_workload

        load_workload(workload, preset=preset, **config.extra)  # fail fast on unknown names/presets
    return pack_workload(workload)


def pack_workload(workload: Workload | str) -> bytes:
    """The workload for another process: by name, by its rebuildable source, or pickled by value
    (cloudpickle, so a class defined in a notebook cell travels). Used by the trial worker and
    by the torchrun ranks; `unpack_workload` is the inverse."""
    import cloudpickle

    if isinstance(workload, str):
        spec: dict[str, Any] = {"kind": "name", "name": workload}
    elif isinstance(workload, Workload) and workload.source:
        spec = {"kind": "source", "source": workload.source}
    elif isinstance(workload, Workload):
        spec = {"kind": "object", "workload": workload}
    else:
        raise WorkloadError(f"a workload is a Workload, a built-in name or 'package.module:attr', got {workload!r}")
    try:
        return bytes(cloudpickle.dumps(spec))
    except Exception as exc:
        raise WorkloadError(_unpicklable_message(workload, exc)) from None


def unpack_workload(payload: bytes) -> Workload | str:
    import cloudpickle

    from workbench.workloads import load_workload

    spec = cloudpickle.loads(payload)
    if spec["kind"] == "name":
        return str(spec["name"])
    if spec["kind"] == "source":
        source = spec["source"]
        return load_workload(source["name"], preset=source.get("preset") or "tiny", **source.get("options", {}))
    workload = spec["workload"]
    if not isinstance(workload, Workload):
        raise WorkloadError(f"the workload payload held a {type(workload).__name__}, not a Workload")
    return workload


def _unpicklable_message(workload: Any, exc: Exception) -> str:
    import cloudpickle

    culprit = "the workload"
    for name in ("model_fn", "loss_fn", "forward_fn", "batch_fn", "dataset_fn", "collate_fn"):
        try:
            cloudpickle.dumps(getattr(workload, name, None))
        except Exception:
            culprit = f"its {name} ({getattr(workload, name)!r})"
            break
    return (
        f"workload '{getattr(workload, 'name', workload)}' cannot be sent to another process: {culprit} "
        f"cannot be pickled ({type(exc).__name__}: {exc}). Define it at module level and pass "
        "'package.module:function', or run with isolation='inline'"
    )


def _follow(
    process: Any,
    receiver: Any,
    on_event: EventSink | None,
    cancel: threading.Event | None,
    timeout_s: float | None,
    name: str,
    config: TrainConfig,
    device: dict[str, Any] | None = None,
) -> TrialResult:
    """Relay events until TrialFinished; turn silence, death and cancel into a status."""
    emit = on_event or (lambda event: None)
    partial = _Partial(name, config)
    partial.result_so_far.device = dict(device or {})  # a timeout or crash still says where it ran
    last_progress = time.monotonic()
    while True:
        if cancel is not None and cancel.is_set():
            return partial.result("cancelled", "cancelled by the caller; the worker was stopped", emit)
        started = bool(partial.result_so_far.trial_id)  # set by TrialStarted
        if timeout_s is not None and time.monotonic() - last_progress > timeout_s + (0 if started else STARTUP_GRACE_S):
            if not started:
                return partial.result("timeout", f"the worker did not start the trial within {timeout_s + STARTUP_GRACE_S:g} s "
                                      f"(--timeout plus {STARTUP_GRACE_S:g} s for start-up); it was killed", emit)  # fmt: skip
            return partial.result("timeout", f"no progress for {timeout_s:g} s; the worker was killed", emit)
        try:
            ready = receiver.poll(POLL_S)
            message = receiver.recv() if ready else None
        except (EOFError, OSError):
            return partial.result(*_death(process), emit)
        if message is None:
            if not process.is_alive() and not receiver.poll(0):
                return partial.result(*_death(process), emit)
            continue
        last_progress = time.monotonic()
        kind = message[0]
        if kind == "event":
            event = message[1]
            partial.observe(event)
            emit(event)
            if isinstance(event, TrialFinished):
                return event.result
        elif kind == "input_error":
            raise _INPUT_ERRORS.get(message[1], ConfigError)(message[2])
        elif kind == "fatal":
            return partial.result("error", message[1], emit)


def _death(process: Any) -> tuple[str, str]:
    process.join(timeout=2)
    code = process.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        if -code == signal.SIGKILL:
            return "oom", f"the worker was killed ({name}) — most likely by the out-of-memory killer"
        return "error", f"the worker process died with signal {name}"
    return "error", f"the worker process exited unexpectedly (exit code {code})"


class _Partial:
    """What the parent has seen so far, to report a trial that never finished."""

    def __init__(self, name: str, config: TrainConfig) -> None:
        self.result_so_far = TrialResult(trial_id="", status="ok", workload=name, config=config.to_dict())

    def observe(self, event: Any) -> None:
        r = self.result_so_far
        if isinstance(event, TrialStarted):
            r.trial_id, r.warmup, r.steps = event.trial_id, event.warmup, event.steps
        elif isinstance(event, StepMeasured):
            (r.step_ms if event.timed else r.warmup_step_ms).append(event.step_ms)
            if event.loss is not None:
                r.losses.append(event.loss)

    def result(self, status: str, message: str, emit: EventSink) -> TrialResult:
        r = self.result_so_far
        r.status, r.message = status, message  # type: ignore[assignment]
        if not r.trial_id:
            import uuid

            r.trial_id = uuid.uuid4().hex[:12]
        emit(TrialFinished(r.trial_id, r))
        return r


# --- the worker side ---------------------------------------------------------------


def _worker_main(
    requests: Any, sender: Any, payload: bytes, config_dict: dict[str, Any], options: dict[str, Any]
) -> None:
    """The worker's job (`measure.child` runs it): rebuild the workload, run inline, send every event."""
    from workbench.measure.child import watch_parent

    watch_parent(requests)
    try:
        from workbench.measure.trial import run_trial_inline

        workload = unpack_workload(payload)
        config = TrainConfig.from_dict(config_dict)
        run_trial_inline(workload, config, cancel=None, on_event=lambda event: sender.send(("event", event)), **options)
    except (ConfigError, WorkloadError) as exc:
        sender.send(("input_error", type(exc).__name__, str(exc)))
    except BaseException as exc:  # anything else must still reach the parent as text
        sender.send(("fatal", f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"))
    finally:
        sender.close()
