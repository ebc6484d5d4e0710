"""Run a trial in a fresh worker process and stream its events back.

Why a process per trial: a crash, an out-of-memory or a hang in the user's model must
end the worker, never the notebook kernel; and every trial must start with a clean
allocator and in-memory compile caches, so memory and compile figures are honest (the disk
cache is reported as cold/warm, or made empty on request: `compile_cache.py`). The worker is a
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
from workbench.measure.events import EventSink
from workbench.measure.follow import STARTUP_GRACE_S, EventRelay
from workbench.measure.profile import ProfileOptions
from workbench.measure.request import TrialRequest
from workbench.measure.result import TrialResult
from workbench.workloads.base import Workload, WorkloadError

#: How often the parent looks at the pipe, the cancel flag and the clock.
POLL_S = 0.05


def run_in_worker(
    request: TrialRequest, on_event: EventSink | None = None, cancel: threading.Event | None = None
) -> TrialResult:
    """A trial in a fresh worker process: the parent side."""
    from workbench.device import device_info, resolve_device
    from workbench.levers import check_config
    from workbench.measure.child import ChildProcess
    from workbench.measure.compile_cache import fresh_cache_environment

    dev = resolve_device(request.device)
    check_config(request.config, dev)  # refuse bad input before paying for a process
    payload = _payload(request.workload, request.preset, request.config)
    # The `finally` below ends the worker (and the DataLoader workers it started) whatever happens;
    # an empty compile cache (WORKBENCH_COMPILE_CACHE=fresh) is removed only after that.
    with fresh_cache_environment() as env:
        child = ChildProcess(_worker_main, payload, request.config.to_dict(), request.for_worker(),
                             memory_limit_bytes=request.memory_limit_bytes, env=env)  # fmt: skip
        try:
            relay = EventRelay(workload_name(request.workload), request.config, on_event)
            relay.partial.device = device_info(dev).to_dict()  # a timeout or crash still says where it ran
            return _follow(child, relay, cancel, request.timeout_s)
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


def _follow(process: Any, relay: EventRelay, cancel: threading.Event | None, timeout_s: float | None) -> TrialResult:
    """Relay events until TrialFinished; turn silence, death and cancel into a status.

    The silence limit counts from the trial's start: until its first event the worker is
    importing torch and building, which gets `STARTUP_GRACE_S` more."""
    receiver = process.inbox
    last_progress = time.monotonic()
    while True:
        if cancel is not None and cancel.is_set():
            return relay.end("cancelled", "cancelled by the caller; the worker was stopped")
        allowed = None if timeout_s is None else timeout_s + (STARTUP_GRACE_S if relay.started_s is None else 0.0)
        if allowed is not None and time.monotonic() - last_progress > allowed:
            if relay.started_s is None:
                return relay.end("timeout", f"the worker did not start the trial within {allowed:g} s (the timeout "
                                            f"plus {STARTUP_GRACE_S:g} s for start-up); it was killed")  # fmt: skip
            return relay.end("timeout", f"no progress for {allowed:g} s; the worker was killed")
        try:
            ready = receiver.poll(POLL_S)
            message = receiver.recv() if ready else None
        except (EOFError, OSError):
            return relay.end(*_death(process))
        if message is None:
            if not process.is_alive() and not receiver.poll(0):
                return relay.end(*_death(process))
            continue
        last_progress = time.monotonic()
        relay.handle(message)
        if relay.finished is not None:
            return relay.finished
        if message[0] == "fatal":
            return relay.end("error", message[1])


def _death(process: Any) -> tuple[str, str]:
    process.join(timeout=2)
    code = process.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        if -code == signal.SIGKILL:
            return "oom", f"the worker was killed ({name}) — most likely by the out-of-memory killer"
        return "error", f"the worker process died with signal {name}"
    return "error", f"the worker process exited unexpectedly (exit code {code})"


# --- the worker side ---------------------------------------------------------------


def _worker_main(
    requests: Any, sender: Any, payload: bytes, config_dict: dict[str, Any], options: dict[str, Any]
) -> None:
    """The worker's job (`measure.child` runs it): rebuild the workload, run inline, send every event."""
    from workbench.measure.child import watch_parent

    watch_parent(requests)
    try:
        from workbench.measure.trial import run_trial_inline

        request = TrialRequest(unpack_workload(payload), TrainConfig.from_dict(config_dict), isolation="inline",
                               profile=ProfileOptions.coerce(options.pop("profile")), **options)  # fmt: skip
        run_trial_inline(request, on_event=lambda event: sender.send(("event", event)))
    except (ConfigError, WorkloadError) as exc:
        sender.send(("input_error", type(exc).__name__, str(exc)))
    except BaseException as exc:  # anything else must still reach the parent as text
        sender.send(("fatal", f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"))
    finally:
        sender.close()
