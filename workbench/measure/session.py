"""A paired session: several configurations built side by side in one worker, timed in blocks.

Why: on a shared host a whole process runs ±10–20% fast or slow, so one process per trial
needs dozens of processes before a ±3% interval. Built in one worker, the baseline and the
candidates see the same process state; blocks of steps alternate between them (the caller
chooses the order of each round), and the ratio of two blocks measured back to back
cancels whatever moves the process. A block starts with one untimed step, so the switch
from another model (cold caches) never enters a step time — except where one step alone is
long enough that those fixed costs vanish against it (the caller decides, per configuration). Memory and compile figures do
*not* come from here — they need a fresh process — only step times.

The worker serves commands from the parent ("round", order, steps) and answers one
"block" message per configuration; the parent owns the protocol (which rounds, when to stop).
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.measure.follow import raise_input_error
from workbench.measure.hostload import ArmMeter
from workbench.measure.request import TrialRequest
from workbench.measure.worker import POLL_S
from workbench.workloads.base import WorkloadError


class SessionFailed(Exception):
    """The paired worker could not build, warm up or time a configuration (its text says why)."""


class PairedSession:
    """Parent side: start the worker, warm every configuration, then run rounds on demand."""

    def __init__(
        self, requests: list[TrialRequest], cancel: threading.Event | None = None, *, wait: bool = True
    ) -> None:
        """`requests`: one per configuration built side by side, the same trial but for `config`
        (`with_config`), each resolved; their warm-up, device, preset and timeout are the window.
        `wait=False` returns once the worker is started (call `wait_ready` before the first round),
        so several can build at once."""
        from workbench.measure.child import ChildProcess

        requests = [request.resolved() for request in requests]  # resolved by the caller: no check again
        self.timeout_s = requests[0].timeout_s
        self.last_loads: dict[int, tuple[float | None, float | None]] = {}
        """The host's load during each block of the last round (`hostload.ArmMeter`), by configuration."""
        self.cancel = cancel
        self.child = ChildProcess(_serve, [request.to_wire() for request in requests])
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until every configuration is built and warm (the worker's "ready"); closes it on failure."""
        try:
            self._receive(startup=True)
        except BaseException:
            self.close()
            raise

    def run_round(self, order: list[int], shapes: dict[int, tuple[int, bool]]) -> dict[int, list[float]]:
        """Time a block of each configuration in `order`, one after another; `shapes[i]` is
        (timed steps, untimed switch step first?) of configuration i's block."""
        self.child.outbox.send(("round", list(order), {i: shapes[i] for i in order}))
        blocks: dict[int, list[float]] = {}
        self.last_loads = {}
        while len(blocks) < len(order):
            _, index, step_ms, *load = self._receive()
            blocks[index] = step_ms
            if load:  # (other processes' cores, our threads' wait per second) during that block
                self.last_loads[index] = load[0]
        return blocks

    def ask_to_stop(self) -> None:
        """Tell the worker to end, without waiting (several then end in parallel)."""
        try:
            self.child.outbox.send(("stop",))
        except OSError:
            pass

    def close(self) -> None:
        self.ask_to_stop()
        self.child.join(2)
        self.child.stop()

    def _receive(self, startup: bool = False) -> Any:
        # Start-up builds and warms every configuration (compiles included): no silence limit there.
        deadline = None if startup or self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            if self.cancel is not None and self.cancel.is_set():
                raise SessionFailed("cancelled by the caller")
            if deadline is not None and time.monotonic() > deadline:
                raise SessionFailed(f"no progress for {self.timeout_s:g} s")
            try:
                if not self.child.inbox.poll(POLL_S):
                    if not self.child.is_alive() and not self.child.inbox.poll(0):
                        raise SessionFailed(f"the paired worker exited (code {self.child.exitcode})")
                    continue
                message = self.child.inbox.recv()
            except (EOFError, OSError):
                raise SessionFailed(f"the paired worker exited (code {self.child.exitcode})") from None
            if message[0] in ("ready", "block"):
                return message
            if message[0] == "input_error":
                raise_input_error(message[1], message[2])
            raise SessionFailed(str(message[-1]))


def open_sessions(
    requests: list[TrialRequest], count: int, cancel: threading.Event | None = None
) -> tuple[list[PairedSession], str]:
    """`count` paired workers: those that became ready, and why any could not ('' when all did).

    Why more than one: two identical configurations built in one worker can differ by a few
    percent for that worker's whole life (where its memory and threads landed), a bias more
    rounds in the same worker cannot average away. Rounds rotated between workers each carry
    their own worker's bias, so it shows in the rounds' spread instead of hiding in the centre.
    A worker that fails (e.g. out of memory with every model resident twice) only costs the
    rotation; `SessionFailed` when none is ready, or on a cancel.

    On a CUDA device the workers build together (their CPU work is compiling and tracing, one
    thread each). On the CPU they build one after another: each worker's warm-up steps use
    every core with its intra-op threads, and two such workers side by side spin against each
    other — two bev-perception tiny workers of 2 configurations took 24 s together on 2 cores,
    against about 3 s each alone."""
    requests = [request.resolved() for request in requests]
    together = requests[0].torch_device().type == "cuda"
    sessions: list[PairedSession] = []
    ready: list[PairedSession] = []
    first_failure: SessionFailed | None = None
    try:
        wanted = max(1, count)
        for number in range(wanted):
            sessions.append(PairedSession(requests, cancel, wait=False))
            if together and number < wanted - 1:
                continue  # every worker starts before the first is awaited
            for session in sessions if together else sessions[-1:]:
                failure = _wait(session, ready, cancel)
                first_failure = first_failure or failure
    except BaseException:  # an input error, a cancel: nothing is measured
        for session in sessions:  # closing twice is harmless: a failed one closed itself
            session.close()
        raise
    if not ready:
        raise first_failure or SessionFailed("no paired worker started")
    return ready, "" if first_failure is None else str(first_failure).splitlines()[0][:200]


def _wait(session: PairedSession, ready: list[PairedSession], cancel: threading.Event | None) -> SessionFailed | None:
    """Wait for one worker: into `ready`, or its failure returned (a cancel raises)."""
    try:
        session.wait_ready()
    except SessionFailed as exc:
        if cancel is not None and cancel.is_set():
            raise
        return exc
    ready.append(session)
    return None


# --- the worker side ---------------------------------------------------------------


def _serve(requests: Any, replies: Any, wires: list[dict[str, Any]]) -> None:
    """The worker's job: build and warm every configuration, then answer round commands until 'stop'."""
    try:
        steps = _build_all([TrialRequest.from_wire(wire) for wire in wires])
    except (ConfigError, WorkloadError) as exc:
        replies.send(("input_error", type(exc).__name__, str(exc)))
        return
    except BaseException as exc:  # an OOM with several models resident, a user error: the parent decides
        replies.send(("failed", f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"))
        return
    replies.send(("ready",))
    while True:
        try:
            command = requests.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if command[0] != "round":
            return
        _, order, shapes = command
        try:
            for index in order:
                train_step, batches, _ = steps[index]
                count, switch = shapes[index]
                replies.send(("block", index, *_time_block(train_step, batches, count, switch)))
        except BaseException as exc:
            replies.send(("failed", f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"))
            return


def _build_all(requests: list[TrialRequest]) -> list[Any]:
    from workbench.levers.build import build
    from workbench.measure.staged import batch_source
    from workbench.measure.timing import synchronize
    from workbench.measure.window import one_step
    from workbench.workloads import load_workload

    built = []
    for request in requests:
        request = request.resolved()  # checked by the parent: trusted as it came
        dev, config, workload = request.torch_device(), request.config, request.workload
        if dev.type == "cuda":
            import torch

            torch.cuda.set_device(dev)  # capture streams and synchronize() act on the current device
        wl = load_workload(workload, preset=request.preset, **config.extra) if isinstance(workload, str) else workload
        train_step = build(wl, config, dev, checked=True)
        batches = batch_source(wl, config, train_step, request.staged_batches)
        for _ in range(paired_warmup(config, request.warmup)):  # untimed (the fresh trial timed these costs)
            one_step(train_step, batches)
        synchronize(dev)
        built.append((train_step, batches, config))
    return built


def paired_warmup(config: TrainConfig, warmup: int) -> int:
    """Untimed steps after building `config` in a paired worker (the request asked for `warmup`).

    The fresh trial already timed the one-time costs; here the steps only have to become steady.
    A compiled or captured configuration keeps them all (a recompile or the capture can come on a
    later step). An eager one needs one: its first step makes the optimizer's state and the
    allocator's blocks, and every block starts with an untimed switch step besides (or is one
    step longer than `block_s`, where such costs vanish)."""
    if config.compile != "off" or config.cuda_graphs or config.compiled_autograd:
        return warmup
    return min(warmup, 1)


def _time_block(train_step: Any, batches: Any, count: int, switch: bool) -> tuple[list[float], Any]:
    """One untimed step (the switch from another model) if asked, then `count` steps on the device's
    clock; with the host's load over those timed steps (`ArmMeter.finish()`)."""
    from workbench.measure.timing import make_clock, synchronize
    from workbench.measure.window import one_step

    if switch:
        one_step(train_step, batches)
    synchronize(train_step.device)
    meter = ArmMeter()
    clock = make_clock(train_step.device)
    for _ in range(count):
        one_step(train_step, batches, clock=clock)
    step_ms = [timing.step_ms for timing in clock.finish()]
    return step_ms, meter.finish()
