"""The rounds: units measured in alternating order until every interval is precise or the budget ends."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from workbench.analysis.compare import UnitLog
from workbench.analysis.intervals import MIN_UNITS
from workbench.config import ConfigError, TrainConfig
from workbench.measure import EventSink, RoundMeasured, TrialRequest, TrialResult
from workbench.measure.child import discard_spares
from workbench.protocol.design import CLOSING_S, Protocol
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.trials import run_request
from workbench.workloads import Workload


def stop_reason(
    protocol: Protocol, floor: int, rounds_done: int, active: int, elapsed_s: float, durations: list[float]
) -> str:
    """Why the rounds stop now ('' to go on): the one stopping rule of every adaptive loop.

    Nothing stops before `floor` rounds (what the interval needs); then: every interval precise,
    `max_rounds`, or the next round would overrun the budget. The next round is budgeted at the
    90th percentile of the rounds so far, not their median: round times vary by ±10–20% here, and
    at the median one round in two that just fitted ran past the budget."""
    if rounds_done < floor:
        return ""
    if not active:
        return f"every interval within ±{protocol.precision:.1%} after {rounds_done} rounds"
    if rounds_done >= protocol.max_rounds:
        return f"max_rounds={protocol.max_rounds} reached"
    longest_likely = sorted(durations)[int(0.9 * (len(durations) - 1))] if durations else 0.0
    if elapsed_s + longest_likely + CLOSING_S > protocol.budget_s:
        return f"budget of {protocol.budget_s:g} s spent after {rounds_done} rounds"
    return ""


def round_order(members: Sequence[int], number: int) -> list[int]:
    """Round `number`'s order: as given on even rounds, reversed on odd ones (B C1 C2, C2 C1 B, …),
    so a "second in line is slower" effect hits every configuration alike."""
    return list(members) if number % 2 == 0 else list(reversed(members))


def mirrored_order(members: Sequence[int], number: int) -> list[list[int]]:
    """Paired round `number` as two halves, the second the mirror of the first: B C | C B on even
    rounds, C B | B C on odd ones.

    Why: in an A/A comparison here (bev-perception tiny, 3 workers, one block per configuration
    and round) the rounds of one order read 1.04–1.09 and those of the other 0.94–0.96: the
    block that opens a round ran ~5% slower than the one after it, and a round's ratio carried
    that whole effect, its sign set by the order; rounds of one order came three in a row (one
    per worker), so neighbouring rounds were not independent, and the interval too narrow.
    Mirrored, each configuration holds one early and one late position in every round: a
    first-in-line effect shrinks to half and changes sign from round to round, and a load that
    rises or falls steadily through the round is cancelled outright (its effect on B C equals
    that on C B)."""
    first = round_order(members, number)
    return [first, list(reversed(first))]


def half_block(shape: tuple[int, bool]) -> tuple[int, bool]:
    """A block of a mirrored round: half the timed steps of `shape` (at least one), so a round of
    two halves times each configuration about as long as one block did, and costs about as much."""
    steps, switch = shape
    return max(1, math.ceil(steps / 2)), switch


def mean_load(halves: Sequence[tuple[float | None, float | None]]) -> tuple[float | None, float | None]:
    """A configuration's load over its blocks in one round: each figure's mean (None if any half lacks it)."""
    figures = []
    for column in zip(*halves):
        known = [value for value in column if value is not None]
        figures.append(sum(known) / len(known) if known and len(known) == len(column) else None)
    return (figures[0], figures[1]) if len(figures) == 2 else (None, None)


def run_rounds(
    workload: Workload | str,
    configs: Sequence[TrainConfig],
    protocol: Protocol,
    half_widths: Any,
    *,
    labels: Sequence[str] = (),
    kind: str = "regress",
    run_label: str = "",
    store: StoreArg = DEFAULT_STORE,
    cancel: threading.Event | None = None,
    on_event: EventSink | None = None,
    **window: Any,
) -> tuple[list[list[TrialResult]], str]:
    """Fresh trials of each configuration, round after round (order alternating), for callers whose
    other side is not measured now — `regress`, against stored references.

    `half_widths(runs)` returns each configuration's interval half-width so far (None: not known
    yet; 0.0 where more trials cannot help, e.g. no reference); a configuration leaves the rounds
    once its width is within ±precision. Stops by `stop_reason`; every trial is saved to `store` as it ends."""
    requests = resolved_requests(TrialRequest.of(workload, configs[0], **window), configs, labels)
    runs: list[list[TrialResult]] = [[] for _ in configs]
    began = time.monotonic()
    durations: list[float] = []
    active = list(range(len(configs)))
    done = 0
    floor = min(protocol.max_rounds, max(protocol.min_rounds, MIN_UNITS))  # unpaired: trials a side
    with opened_store(store) as history:
        recorder = history.recorder(kind, label=run_label) if history is not None else None
        while True:
            if cancel is not None and cancel.is_set():
                return runs, "cancelled"
            reason = stop_reason(protocol, floor, done, len(active), time.monotonic() - began, durations)
            if reason:
                return runs, reason
            round_began = time.monotonic()
            for index in round_order(active, done):
                result = run_request(requests[index], on_event, cancel)
                if recorder is not None:
                    recorder.save(result, label=labels[index] if index < len(labels) else "")
                runs[index].append(result)
            durations.append(time.monotonic() - round_began)
            done += 1
            failed = {i for i in active if not runs[i][-1].ok}  # a failure is reported, never retried blindly
            if done >= floor:
                widths = half_widths(runs)
                active = [
                    i for i in active if i not in failed and (widths[i] is None or widths[i] > protocol.precision)
                ]
            else:
                active = [i for i in active if i not in failed]


class Rounds:
    """The adaptive loop: one round at a time, until precise, out of budget or out of rounds."""

    def __init__(self, requests: list[TrialRequest], runs: list[list[TrialResult]], protocol: Protocol,
                 design: str, began: float, emit: EventSink, cancel: threading.Event | None,
                 fresh: Any) -> None:  # fmt: skip
        self.requests, self.runs, self.protocol = requests, runs, protocol
        self.design, self.began, self.emit, self.cancel = design, began, emit, cancel
        self.fresh = fresh
        self.log = UnitLog()
        self.note = ""
        self.workers = 0
        """Paired workers the rounds rotated between (0: the processes design)."""
        self.loads: dict[int, tuple[float | None, float | None]] = {}
        """The host's load during each configuration's block of the round just measured (paired design)."""

    def run(self) -> tuple[UnitLog, str]:
        ok = [i for i, r in enumerate(self.runs) if r and all(x.ok for x in r)]
        if 0 not in ok or len(ok) < 2:
            return self.log, "the baseline or every candidate failed to run: nothing to compare"
        if self.design == "paired":
            reason = self._paired(ok)
            if reason is not None:
                return self.log, reason
            self.note = f"; the paired worker failed ({self.note}), so the rounds used fresh processes"
            self.design, self.log = "processes", UnitLog()
        for index in ok:  # the characterizing trials are the processes design's first round
            self.log.add(index, 0, self.runs[index][-1].step_ms)
        return self.log, self._loop(ok, self._process_round, start=1) + self.note

    def _paired(self, ok: list[int]) -> str | None:
        from workbench.measure.session import SessionFailed, open_sessions

        wanted = self.protocol.paired_workers
        try:
            sessions, why_fewer = open_sessions([self.requests[i] for i in ok], wanted, self.cancel)
        except SessionFailed as exc:
            if self.cancel is not None and self.cancel.is_set():
                return "cancelled"
            self.note = str(exc).splitlines()[0][:200]
            return None
        self.workers = len(sessions)
        fewer = f"; {len(sessions)} of {wanted} paired workers ({why_fewer})" if why_fewer else ""
        try:
            local = {config: position for position, config in enumerate(ok)}
            shapes = {local[i]: half_block(self.protocol.block_for(self.runs[i][0].median_step_ms)) for i in ok}

            def one_round(number: int, members: list[int]) -> dict[int, list[float]]:
                # Worker number mod n. Each round is mirrored (B C C B, then C B B C the next round),
                # so a first-in-line effect and a load that rises or falls steadily inside the
                # round hit every configuration alike (`mirrored_order`).
                session = sessions[number % len(sessions)]
                steps: dict[int, list[float]] = {}
                loads: dict[int, list[tuple[float | None, float | None]]] = {}
                for half in mirrored_order(members, number):
                    blocks = session.run_round([local[i] for i in half], shapes)
                    for position, step_ms in blocks.items():
                        steps.setdefault(ok[position], []).extend(step_ms)
                    for position, load in session.last_loads.items():
                        loads.setdefault(ok[position], []).append(load)
                self.loads = {index: mean_load(halves) for index, halves in loads.items()}
                return steps

            return self._loop(ok, one_round, start=0) + fewer
        except SessionFailed as exc:
            return "cancelled" if self.cancel is not None and self.cancel.is_set() else f"stopped: {exc}"
        finally:
            for session in sessions:  # each worker's exit (torch's teardown) overlaps the others'
                session.ask_to_stop()
            for session in sessions:
                session.close()

    def _process_round(self, number: int, members: list[int]) -> dict[int, list[float]]:
        blocks = {}
        for index in round_order(members, number):
            result = self.fresh(index)
            self.runs[index].append(result)
            if not result.ok:
                raise RoundFailed(f"{result.status} in a later round of config {index}: {result.message[:120]}")
            blocks[index] = result.step_ms
        return blocks

    def _loop(self, ok: list[int], measure: Any, start: int) -> str:
        p = self.protocol
        active = [i for i in ok if i != 0]
        durations: list[float] = []
        number = start
        while True:
            if self.cancel is not None and self.cancel.is_set():
                return "cancelled"
            reason = stop_reason(p, p.rounds_floor, number, len(active), time.monotonic() - self.began, durations)
            if reason:
                return reason
            round_began = time.monotonic()
            self.log.began_s[number] = round_began - self.began
            self.loads = {}
            try:
                blocks = measure(number, [0, *active])
            except RoundFailed as exc:
                return f"stopped: {exc}"
            durations.append(time.monotonic() - round_began)
            for index, step_ms in blocks.items():
                self.log.add(index, number, step_ms, self.loads.get(index))
            number += 1
            widths = self._half_widths(ok)
            if number >= p.rounds_floor:
                active = [i for i in active if widths[i] is None or widths[i] > p.precision]  # type: ignore[operator]
            self.emit(RoundMeasured(number, self.design, blocks, widths, p.precision, time.monotonic() - self.began,
                                    p.budget_s))  # fmt: skip

    def _half_widths(self, ok: list[int]) -> dict[int, float | None]:
        from workbench.analysis.compare import estimate, shift

        paired = self.design == "paired"
        widths: dict[int, float | None] = {}
        for index in ok:
            if index == 0:
                continue
            est = estimate(self.log, 0, index, paired=paired, confidence=self.protocol.confidence)
            widths[index] = est.half_width if est is not None else None
            if paired and shift(self.log, 0, index).withheld:
                # Not known yet, however narrow: quiet rounds to come may bring the affected share
                # back under the line, so the rounds go on while the budget lasts.
                widths[index] = None
        return widths


@contextlib.contextmanager
def spare_workers(request: TrialRequest, design: str, count: int) -> Iterator[None]:
    """Workers for the characterizing trials and the paired session, started together before
    anything is measured (their start-ups share the CPUs instead of queueing); unused ones end
    with the comparison. Not for torchrun trials, nor a process-isolated request that is not."""
    from workbench.measure.child import prestart
    from workbench.measure.compile_cache import fresh_cache_requested

    # A fresh compile cache per trial needs its own environment, which a spare started earlier lacks.
    if design == "paired" and request.isolation == "process" and not fresh_cache_requested():
        prestart(count)
    try:
        yield
    finally:
        discard_spares()


class RoundFailed(Exception):
    """A unit of a later round failed (the characterizing trial had succeeded)."""


def resolved_requests(
    request: TrialRequest, configs: Sequence[TrainConfig], names: Sequence[str]
) -> list[TrialRequest]:
    """`request` for each configuration, resolved: a refusal names the configuration it refuses."""
    requests = []
    for index, config in enumerate(configs):
        try:
            requests.append(request.with_config(config).resolved())
        except ConfigError as exc:
            raise ConfigError(f"{names[index] if index < len(names) else f'configuration {index}'}: {exc}") from None
    return requests
