"""The app's trials: what was asked, what ran, and the one background runner that runs them in turn.

Trials run one at a time — two trials sharing the CPUs or the GPU would measure each
other. A baseline is one trial (`workbench.api.start_trial`, a worker process); a candidate
with a baseline is a comparison by the calibrated protocol (`start_comparison`: its fresh
trial, then paired rounds against the baseline until precise or out of budget), re-using
the baseline's finished trial. The kernel stays free and Cancel ends the workers. The
runner never touches a widget: it appends (record, event) pairs to an inbox that the app's
pump drains a few times a second, which keeps UI work off the trial's path and on one thread.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from workbench.analysis.compare import CandidateComparison, Comparison
from workbench.api import ComparisonRun, Protocol, TrialHandle, start_comparison, start_trial
from workbench.config import TrainConfig
from workbench.measure import Event, TrialRequest, TrialResult
from workbench.workloads import Workload

Role = Literal["baseline", "candidate"]


@dataclass
class RunSpec:
    """Everything a trial needs besides its config: the same for baseline and candidates."""

    request: TrialRequest
    """The window (workload, warm-up, steps, preset, device, timeout, profile); each entry runs it with its own config."""
    workload_label: str
    protocol: Protocol = field(default_factory=Protocol)
    """How a candidate is compared with the baseline (precision, budget, confidence, rounds, workers)."""

    @property
    def workload(self) -> Workload | str:
        return self.request.workload

    @property
    def preset(self) -> str:
        return self.request.preset

    @property
    def warmup(self) -> int:
        return self.request.warmup

    @property
    def steps(self) -> int:
        return self.request.steps


@dataclass
class Entry:
    """One configuration in the comparison (the baseline or a candidate) and its repeats."""

    key: int
    role: Role
    config: TrainConfig
    spec: RunSpec
    color: str
    records: list[TrialRecord] = field(default_factory=list)
    baseline: Entry | None = None
    """The baseline a candidate is compared against (None: ran alone)."""
    row: CandidateComparison | None = None
    """The protocol's verdict for this candidate, once its comparison finished."""
    comparison: Comparison | None = None

    @property
    def label(self) -> str:
        name = "baseline" if self.role == "baseline" else f"candidate {self.key}"
        return f"{name}: {self.config.describe()}"

    def results(self) -> list[TrialResult]:
        return [r.result for r in self.records if r.result is not None]

    @property
    def finished(self) -> bool:
        return bool(self.records) and all(r.result is not None for r in self.records)


@dataclass
class TrialRecord:
    """One trial's live state, written only by the app's pump thread."""

    entry: Entry
    repeat: int
    status: str = "queued"
    steps_done: int = 0
    last_step_ms: float | None = None
    step_ms: list[float] = field(default_factory=list)
    result: TrialResult | None = None
    cancel_requested: bool = False
    bar: Any = None
    """The app's progress bar and caption for this trial (widgets, set by the app)."""
    caption: Any = None
    round_text: str = ""
    """The protocol's progress while a comparison runs its rounds."""

    @property
    def total_steps(self) -> int:
        return self.entry.spec.warmup + self.entry.spec.steps


Inbox = collections.deque[tuple[TrialRecord, Any]]


def finish(record: TrialRecord, outcome: TrialResult | ComparisonRun) -> None:
    """Put a finished trial or comparison on its record (and a comparison's verdict on its entry)."""
    if isinstance(outcome, ComparisonRun):
        record.entry.row = outcome.comparison.candidates[0]
        record.entry.comparison = outcome.comparison
        outcome = outcome.candidate_runs[0][0]
    record.result, record.status = outcome, outcome.status


class TrialRunner:
    """A daemon thread that takes records from a queue and runs each through `start_trial`."""

    def __init__(self, inbox: Inbox, wake: Callable[[], None]) -> None:
        self._inbox = inbox
        self._wake = wake
        self._queue: queue.Queue[TrialRecord | None] = queue.Queue()
        self._lock = threading.Lock()
        self._current: tuple[TrialRecord, TrialHandle] | None = None
        self._pending = 0
        # Results this runner produced, by entry: a candidate's comparison re-uses its baseline's
        # trial as soon as it ended, without waiting for the pump to put it on the record.
        self._finished: dict[int, list[TrialResult]] = {}
        self._thread = threading.Thread(target=self._loop, name="workbench-trial-runner", daemon=True)
        self._thread.start()

    def submit(self, record: TrialRecord) -> None:
        with self._lock:
            self._pending += 1
        self._queue.put(record)

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._pending > 0

    @property
    def current(self) -> TrialRecord | None:
        with self._lock:
            return self._current[0] if self._current else None

    def cancel_all(self) -> None:
        """Cancel the running trial (its worker is ended) and every queued one."""
        with self._lock:
            current = self._current
        for record in list(self._queue.queue):
            if record is not None:
                record.cancel_requested = True
        if current is not None:
            current[0].cancel_requested = True
            current[1].cancel()

    def close(self) -> None:
        self.cancel_all()
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            record = self._queue.get()
            if record is None:
                return
            try:
                self._run_one(record)
            finally:
                with self._lock:
                    self._current = None
                    self._pending -= 1
                self._wake()

    def _run_one(self, record: TrialRecord) -> None:
        entry = record.entry
        spec = entry.spec
        if record.cancel_requested:
            self._post(record, failed_result(entry, "cancelled", "cancelled before it started"))
            return

        def on_event(event: Event, record: TrialRecord = record) -> None:
            self._inbox.append((record, event))  # deque.append is atomic; the pump does the rest

        options = dict(spec.request.options(), on_event=on_event)
        known = [r for r in self._finished.get(id(entry.baseline), []) if r.ok]
        try:
            if known and entry.baseline is not None:
                handle = start_comparison(spec.workload, entry.baseline.config, [entry.config], protocol=spec.protocol,
                                          known_baseline=known, **options)  # fmt: skip
            else:
                handle = start_trial(spec.workload, entry.config, **options)
        except Exception as exc:  # start_trial only starts a thread; kept for safety
            self._post(record, failed_result(entry, "error", f"{type(exc).__name__}: {exc}"))
            return
        with self._lock:
            self._current = (record, handle)
        if record.cancel_requested:  # Cancel arrived between dequeue and start
            handle.cancel()
        self._post(record, "running")
        try:
            outcome = handle.result()
        except Exception as exc:  # input errors (ConfigError, WorkloadError) are raised here
            outcome = failed_result(entry, "error", f"{type(exc).__name__}: {exc}")
        own = outcome.candidate_runs[0] if isinstance(outcome, ComparisonRun) else [outcome]
        self._finished.setdefault(id(entry), []).extend(own)
        self._post(record, outcome)

    def _post(self, record: TrialRecord, item: Any) -> None:
        self._inbox.append((record, item))
        self._wake()


def failed_result(entry: Entry, status: str, message: str) -> TrialResult:
    """A result for a trial that never produced one (refused input, cancelled while queued)."""
    return TrialResult(
        trial_id=uuid.uuid4().hex[:12],
        status=status,  # type: ignore[arg-type]
        workload=entry.spec.workload_label,
        config=entry.config.to_dict(),
        message=message,
        preset=entry.spec.preset,
        warmup=entry.spec.warmup,
        steps=entry.spec.steps,
        started_at=time.time(),
    )
