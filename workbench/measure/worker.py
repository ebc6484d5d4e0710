"""Run a trial in a fresh worker process and stream its events back.

Why a process per trial: a crash, an out-of-memory or a hang in the user's model must
end the worker, never the notebook kernel; and every trial must start with a clean
allocator and in-memory compile caches, so memory and compile figures are honest (the disk
cache is reported as cold/warm, or made empty on request: `compile_cache.py`). The worker never
re-runs the caller's `__main__` (`measure.child`), so any script works, guarded or not.
The request travels in its wire form (`TrialRequest.to_wire`): built-ins and 'module:attr'
specs are rebuilt by name in the worker, any other workload is cloudpickled (so a class defined
in a notebook cell works).
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from dataclasses import replace
from typing import Any

from workbench.config import ConfigError
from workbench.measure.events import EventSink
from workbench.measure.follow import STARTUP_GRACE_S, EventRelay
from workbench.measure.request import TrialRequest
from workbench.measure.result import TrialResult
from workbench.measure.wire import workload_name
from workbench.workloads import load_workload
from workbench.workloads.base import WorkloadError

#: How often the parent looks at the pipe, the cancel flag and the clock.
POLL_S = 0.05


def run_in_worker(
    request: TrialRequest, on_event: EventSink | None = None, cancel: threading.Event | None = None
) -> TrialResult:
    """A trial in a fresh worker process: the parent side."""
    from workbench.device import device_info
    from workbench.measure.child import ChildProcess
    from workbench.measure.compile_cache import fresh_cache_environment

    request = request.resolved()  # refuse bad input before paying for a process (once: the worker trusts it)
    if isinstance(request.workload, str):  # fail fast on unknown names/presets, here rather than in the worker
        load_workload(request.workload, preset=request.preset, **request.config.extra)
    wire = request.to_wire()
    # The `finally` below ends the worker (and the DataLoader workers it started) whatever happens;
    # an empty compile cache (WORKBENCH_COMPILE_CACHE=fresh) is removed only after that.
    with fresh_cache_environment() as env:
        child = ChildProcess(_worker_main, wire, memory_limit_bytes=request.memory_limit_bytes, env=env)
        try:
            relay = EventRelay(workload_name(request.workload), request.config, on_event)
            relay.partial.device = device_info(request.torch_device()).to_dict()  # a timeout or crash still says where
            return _follow(child, relay, cancel, request.timeout_s)
        finally:
            child.stop()


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


def _worker_main(requests: Any, sender: Any, wire: dict[str, Any]) -> None:
    """The worker's job (`measure.child` runs it): rebuild the request, run it inline, send every event."""
    from workbench.measure.child import watch_parent

    watch_parent(requests)
    try:
        from workbench.measure.trial import run_trial_inline

        # The limits are the parent's to enforce (it kills this process); here the trial runs inline.
        request = replace(TrialRequest.from_wire(wire), isolation="inline", timeout_s=None, memory_limit_bytes=None)
        run_trial_inline(request, on_event=lambda event: sender.send(("event", event)))
    except (ConfigError, WorkloadError) as exc:
        sender.send(("input_error", type(exc).__name__, str(exc)))
    except BaseException as exc:  # anything else must still reach the parent as text
        sender.send(("fatal", f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"))
    finally:
        sender.close()
