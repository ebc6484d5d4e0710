"""The watched job's only link to the store: a bounded hand-off and a daemon thread that drains it.

The training thread only appends raw step records to a bounded deque (a full deque drops
the record and counts it); this thread resolves them (CUDA events once `query()` says
they are done, so nothing synchronizes the job), folds them into the bounded
`StepHistory`, and writes one transaction per flush. A store that cannot be opened or
written costs the job nothing: the flush is dropped, counted and reported once on
stderr, and tried again at the next flush, on this thread only.
"""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.fingerprint import environment_fingerprint
from workbench.measure.hostload import HostCpu
from workbench.measure.monitor import DeviceMonitor
from workbench.measure.schedstat import step_deltas
from workbench.measure.syncwait import elapsed_ms, stamp_done
from workbench.store import DEFAULT_STORE, StoreArg, default_store_path
from workbench.store.core import Store
from workbench.store.watch_profiles import save_profile, take_request
from workbench.store.watched import StepRow, flush_watch_run, start_watch_run
from workbench.watch.compiled import CompileCounts
from workbench.watch.profiling import ProfileJob, WatchProfile, WindowProfiler, reduce_window
from workbench.watch.ranks import rank_info
from workbench.watch.steps import StepHistory
from workbench.watch.summary import run_summary, window_utilization


@dataclass
class RawStep:
    """One step's boundaries as stamped in the loop: perf_counter floats on CPU, CUDA events on GPU."""

    step: int
    wall_time: float
    start: Any
    end: Any
    data_s: float
    forward: tuple[Any, Any] | None
    optimizer: tuple[Any, Any] | None
    loss: Any
    peak_memory_bytes: int | None
    grad_sync: tuple[Any, Any] | None = None
    """(last gradient accumulated, backward's end) stamps; either None when not seen."""
    entry_waits: list[tuple[Any, Any]] = field(default_factory=list)
    """(entry, model code begins) stamps of the step's forwards: any synchronization at their entry."""
    thread_times: tuple[float, float] | None = None
    """The training thread's running totals at the step's end: (s on a core, s waiting for one)."""
    stages: dict[str, float] | None = None
    """Milliseconds per `wb.stage` marked in the batches the step used; None where none was."""


class Writer:
    """Owns the daemon thread; `offer()` is the only call the training thread makes."""

    def __init__(
        self,
        store: StoreArg,
        *,
        name: str,
        config: dict[str, Any],
        warmup: int,
        device: Any,
        flush_s: float,
        capacity: int,
        max_rows: int,
        recent: int,
        profiler: WindowProfiler | None = None,
        compile_counts: CompileCounts | None = None,
    ) -> None:
        self.name, self.config, self.warmup, self.device = name, config, warmup, device
        self.flush_s = flush_s
        self.capacity = capacity
        self.history = StepHistory(max_rows, recent)
        self.run_id: int | None = None
        self.dropped_steps = 0
        self.dropped_writes = 0
        self.first_nonfinite_loss_step: int | None = None
        self.last_error = ""
        self._store_arg = store
        self.profiler = profiler
        self.compile_counts = compile_counts
        self.last_profile: WatchProfile | None = None
        self._windows: collections.deque[ProfileJob] = collections.deque()
        self._pending: collections.deque[RawStep] = collections.deque()
        self._unresolved: collections.deque[RawStep] = collections.deque()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by close() and flush_now(): the next flush is now, not in flush_s
        self._flushed = threading.Condition()
        self._asked = self._answered = 0  # flush_now() tickets: asked, and answered by a flush begun after
        self._ended: str | None = None
        self._failure: dict[str, Any] | None = None
        self._warned = False
        self._window: dict[str, Any] = {}
        self._energy_j: float | None = None
        self._thread_times: tuple[float, float] | None = None
        self._host_cpu: HostCpu | None = None
        self._thread = threading.Thread(target=self._run, name="workbench-watch-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, record: RawStep) -> None:
        """Hand a step over without waiting; dropped (and counted) when the writer has fallen behind."""
        if len(self._pending) < self.capacity:
            self._pending.append(record)
        else:
            self.dropped_steps += 1

    def offer_profile(self, window: ProfileJob) -> None:
        """A finished profiled window, reduced and stored on this thread."""
        self._windows.append(window)

    def close(self, ended: str, timeout_s: float, failure: dict[str, Any] | None = None) -> None:
        """Ask for the last flush (marking the run ended, or failed when `failure` says how) and wait
        for it at most `timeout_s`."""
        self._failure = failure
        self._ended = ended
        self._stop.set()
        self._wake.set()
        self.wait(timeout_s)

    def flush_now(self, timeout_s: float) -> None:
        """Write what has been handed over so far, now, and wait for it at most `timeout_s` (the run goes on)."""
        with self._flushed:
            self._asked += 1
            ticket = self._asked
            self._wake.set()
            self._flushed.wait_for(lambda: self._answered >= ticket or not self._thread.is_alive(), timeout_s)

    def wait(self, timeout_s: float) -> None:
        """Wait at most `timeout_s` for the thread to finish its last flush (asked for by `close`)."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # --- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        monitor = _start_monitor(self.device)
        self._host_cpu = HostCpu()
        store: Store | None = None
        try:
            while True:
                self._wake.wait(self.flush_s)
                self._wake.clear()
                stopping = self._stop.is_set()
                with self._flushed:
                    asked = self._asked  # steps offered before these tickets are in the drain below
                self._drain(final=stopping)
                if monitor is not None:
                    window = window_utilization(monitor.samples(since=self._window.get("end")))
                    if window:
                        self._window = window
                        self._add_energy(window)
                if store is None:
                    store = self._open()
                self._flush(store, ended=self._ended if stopping else None)
                self._profile_windows(store, final=stopping)
                with self._flushed:
                    self._answered = asked
                    self._flushed.notify_all()
                if stopping:
                    return
        finally:
            if monitor is not None:
                monitor.close()
            if store is not None and store is not self._store_arg:
                store.close()

    def _open(self) -> Store | None:
        """The store to write, or None (no store asked for, or it cannot be opened now: counted, said once)."""
        arg = self._store_arg
        if isinstance(arg, Store) or arg is None:
            return arg
        path = default_store_path() if arg is DEFAULT_STORE else arg
        if path is None:
            return None
        try:
            return Store(path)
        except Exception as exc:
            self.dropped_writes += 1
            self._report(f"{type(exc).__name__}: {exc}")
            return None

    def _drain(self, final: bool) -> None:
        while self._pending:
            self._unresolved.append(self._pending.popleft())
        while self._unresolved:
            record = self._unresolved[0]
            if not stamp_done(record.end):
                if not final:
                    return
                record.end.synchronize()  # the job has left the loop: only this thread waits
            self._unresolved.popleft()
            cpu = step_deltas(self._thread_times, record.thread_times)
            self._thread_times = record.thread_times
            row = _resolve(record, *cpu)
            # Here, one step at a time: in the downsampled history a NaN spreads to its whole bucket.
            if self.first_nonfinite_loss_step is None and row.loss is not None and not math.isfinite(row.loss):
                self.first_nonfinite_loss_step = row.first_step
            self.history.add(row)

    def _flush(self, store: Store | None, ended: str | None) -> None:
        if store is None:
            return
        history, replaced, recent, recent_from = self.history.changes()
        summary = run_summary(self.history.rows(), self.warmup, self.history, self._window, self._energy_j,
                              self.dropped_steps, self.dropped_writes)  # fmt: skip
        summary["host_cpu"] = self._host_cpu.figures() if self._host_cpu is not None else None
        summary["first_nonfinite_loss_step"] = self.first_nonfinite_loss_step
        summary["compile"] = self.compile_counts.summary() if self.compile_counts is not None else None
        if ended is not None and self._failure is not None:
            summary["failure"] = self._failure  # how it failed, as fields: a job's reader names its first failed rank
        try:
            if self.run_id is None:
                environment = environment_fingerprint(self.device)
                ranks = rank_info(self.name)
                self.run_id = start_watch_run(store, self.name, config=self.config, environment=environment,
                                              warmup=self.warmup, pid=os.getpid(), rank=ranks.rank,
                                              world_size=ranks.world_size, job=ranks.job)  # fmt: skip
            flush_watch_run(
                store,
                self.run_id,
                last_step=self.history.last_step,
                summary=summary,
                history=history,
                replace_history=replaced,
                recent=recent,
                recent_from=recent_from,
                ended=ended,
                failed=self._failure is not None,
            )
        except Exception as exc:
            self.dropped_writes += 1
            self.history.changes_lost()
            self._report(f"{type(exc).__name__}: {exc}")

    def _profile_windows(self, store: Store | None, final: bool) -> None:
        """Reduce and store finished windows whose steps are resolved; take a request made from outside."""
        while self._windows and (final or self.history.last_step >= self._windows[0].last_step):
            window = self._windows.popleft()
            try:
                result = reduce_window(window, list(self.history.recent), self.config, self.name, self.device)
            except Exception as exc:  # a window that cannot be reduced is reported, never raised in the job
                result = WatchProfile(None, None, window.first_step, window.last_step, f"{type(exc).__name__}: {exc}")
            self.last_profile = result
            if store is not None and self.run_id is not None:
                try:
                    save_profile(store, self.run_id, window.request_id, steps=window.options.active,
                                 first_step=result.first_step, last_step=result.last_step,
                                 diagnosis=result.diagnosis.to_dict() if result.diagnosis else None,
                                 profile=result.profile, message=result.message)  # fmt: skip
                except Exception as exc:
                    self.dropped_writes += 1
                    self._report(f"{type(exc).__name__}: {exc}")
        if final or store is None or self.run_id is None or self.profiler is None or self.profiler.busy:
            return
        try:
            request = take_request(store, self.run_id)
        except Exception:  # an older store or a locked file: asked again at the next flush
            return
        if request is not None and not self.profiler.request(request[1], request[0]):
            try:  # the job asked for a window itself meanwhile: this request is answered, not left open
                save_profile(store, self.run_id, request[0], steps=request[1], first_step=0, last_step=0,
                             diagnosis=None, profile=None, message="another window was being profiled; ask again")  # fmt: skip
            except Exception:
                self.dropped_writes += 1

    def _add_energy(self, window: dict[str, Any]) -> None:
        if window.get("energy_j") is not None:
            self._energy_j = (self._energy_j or 0.0) + window["energy_j"]

    def _report(self, why: str) -> None:
        self.last_error = why
        if self._warned:
            return
        self._warned = True
        print(f"workbench.watch: cannot write the run history ({why}); training goes on, its step rows are "
              "dropped and counted (Watch.dropped_writes) and the store is tried again later", file=sys.stderr)  # fmt: skip


def _start_monitor(device: Any) -> DeviceMonitor | None:
    try:
        return DeviceMonitor(rate_hz=2.0, history_s=30.0, include_children=False,
                             use_nvml=device.type == "cuda").start()  # fmt: skip
    except Exception:  # utilization is a nice-to-have; the watch goes on without it
        return None


def _resolve(r: RawStep, cpu_ms: float | None = None, cpu_wait_ms: float | None = None) -> StepRow:
    forward = backward = optimizer = sync_wait = None
    entry_wait = sum(elapsed_ms(a, b) for a, b in r.entry_waits) if r.entry_waits else None
    if r.forward is not None:
        forward = elapsed_ms(*r.forward)
        if r.optimizer is not None:
            backward = elapsed_ms(r.forward[1], r.optimizer[0])
    if r.optimizer is not None:
        optimizer = elapsed_ms(*r.optimizer)
    ready, ended = r.grad_sync or (None, None)
    if ended is None and r.optimizer is not None:  # the optimizer step stands in for backward's end
        ended = r.optimizer[0]
    if ready is not None and ended is not None:
        sync_wait = max(0.0, elapsed_ms(ready, ended))
    if backward is not None and backward < 0:
        # The optimizer step began before the forward ended: it runs the forward and backward inside
        # (a closure, as Lightning's loop does), so its time holds them and backward has no edge.
        backward = optimizer = sync_wait = None
    return StepRow(
        r.step,
        1,
        r.wall_time,
        elapsed_ms(r.start, r.end),
        r.data_s * 1000.0,
        forward,
        backward,
        optimizer,
        r.peak_memory_bytes,
        _loss_value(r.loss),
        entry_wait,
        sync_wait,
        cpu_ms,
        cpu_wait_ms,
        stages=r.stages,
    )


def _loss_value(loss: Any) -> float | None:
    """The loss as a float, read after its step finished (a CUDA tensor through a side stream, so the
    read never queues behind the job's work)."""
    if loss is None:
        return None
    if isinstance(loss, (int, float)):
        return float(loss)
    try:
        if loss.is_cuda:
            with torch.cuda.stream(torch.cuda.Stream(device=loss.device)):
                return float(loss.item())
        return float(loss.item())
    except Exception:
        return None
