"""The one comparison protocol behind `compare`, `regress`, the notebook app and the tuner.

1. **Characterize** every configuration once in a fresh worker: memory, compile time, the
   loss trajectory for the numerics check, and the stored trial. Its step times are one
   process's, so they never decide a verdict on their own.
2. **Rounds** until each candidate's speedup interval is within ±`precision`, or the budget
   is spent. A round measures one unit of the baseline and of every candidate still
   imprecise, in an order that alternates round by round (B C1 C2, C2 C1 B, …), so an order
   effect cancels and rounds go where the interval is widest.
   - `paired` design (the default where honest): a worker holds every configuration;
     a unit is a block of steps (about `block_s` seconds of them, at most `block_steps`). Whatever
     moves a whole process moves both sides of a ratio. Rounds rotate between `paired_workers`
     such workers, so the bias one worker holds for its whole life lands in the spread.
   - `processes` design: a unit is a fresh worker's trial. Needed for distributed trials
     (torchrun), DataLoader workers (idle configurations' loader processes would load
     the CPU while another is timed) and compiled configurations that differ in a setting
     dynamo does not guard (`UNGUARDED_BY_DYNAMO`); slower to converge, since every unit
     carries its process's own ±10–20%.
3. **Verdict** from `analysis.compare.compare_units`: the signed-rank interval over paired
   rounds, Welch's over process units; too few units is "inconclusive", with how many more
   rounds the noise seen calls for.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from workbench.analysis.compare import Comparison, UnitLog, compare_units, summarize
from workbench.analysis.intervals import MIN_UNITS, min_paired_rounds
from workbench.analysis.numerics import check_numerics
from workbench.config import ConfigError, TrainConfig
from workbench.measure import EventSink, RoundMeasured, TrialRequest, TrialResult
from workbench.measure.child import discard_spares
from workbench.measure.hostload import HostLoad
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.trials import run_request
from workbench.workloads import Workload

Design = Literal["auto", "paired", "processes"]

CLOSING_S = 3.0
"""Kept back from the budget for what follows the last round: ending the paired workers (each
joins its process; three of them) and computing the verdict. Measured here at 2.5–3 s from the
last round's end to the comparison's return; at 1.5 s, comparisons ended at up to 60.9 s of 60."""


@dataclass(frozen=True)
class Protocol:
    """How sure a comparison must be, and how long it may take to get there."""

    precision: float = 0.03
    """Target relative half-width of every candidate's speedup interval (0.03 = ±3%)."""
    budget_s: float = 60.0
    """Wall-clock seconds for the whole comparison; rounds stop when the next would overrun it
    (the characterizing trials and `min_rounds` always run)."""
    confidence: float = 0.95
    margin: float = 0.02
    """Equivalence margin: an effect smaller than this is "no significant difference"."""
    design: Design = "auto"
    """'paired' where honest (else 'processes'), or forced."""
    block_steps: int = 5
    """Most timed steps per unit in the paired design (after one untimed switch step)."""
    block_s: float = 1.0
    """Target timed seconds per unit in the paired design: a configuration whose step is slow gets
    fewer steps (at least one), so one slow candidate does not make every round long."""
    paired_workers: int = 3
    """Paired design: workers the rounds rotate between (round r in worker r mod n). Each worker
    carries a bias of a few percent between configurations for its whole life (where its memory
    and threads landed); rotating shows it in the rounds' spread, but the centre is still the mean
    of n workers' biases, which no number of rounds averages away. With 2 workers a 2% bias gave
    ~9% false A/A verdicts in simulation at this machine's round noise, with 3 ~7%. Each worker
    costs a copy of every model's memory and (on the CPU) a few seconds of start-up; 1 saves
    both, at the cost of that bias."""
    min_rounds: int = 6
    """Rounds always measured (raised to what `confidence` needs: 6 at 95%, 8 at 99%)."""
    max_rounds: int = 200

    def __post_init__(self) -> None:
        if not 0.001 <= self.precision <= 0.5:
            raise ConfigError(
                f"precision must be a fraction between 0.001 and 0.5 (0.03 = ±3%), got {self.precision!r}"
            )
        if not self.budget_s > 0:
            raise ConfigError(f"budget must be a positive number of seconds, got {self.budget_s!r}")
        if not 0.5 <= self.confidence < 1.0:
            raise ConfigError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if not 0.0 <= self.margin < 0.5:
            raise ConfigError(f"margin must be a fraction in [0, 0.5), got {self.margin!r}")
        if self.design not in ("auto", "paired", "processes"):
            raise ConfigError(f"design must be 'auto', 'paired' or 'processes', got {self.design!r}")
        if isinstance(self.block_steps, bool) or not isinstance(self.block_steps, int) or self.block_steps < 1:
            raise ConfigError(f"block_steps must be an integer >= 1, got {self.block_steps!r}")
        if not self.block_s > 0:
            raise ConfigError(f"block_s must be a positive number of seconds, got {self.block_s!r}")
        workers = self.paired_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 8:
            raise ConfigError(f"paired_workers must be an integer from 1 to 8, got {self.paired_workers!r}")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ConfigError(
                f"rounds must satisfy 1 <= min_rounds <= max_rounds, got min_rounds={self.min_rounds}, "
                f"max_rounds={self.max_rounds}"
            )

    def block_for(self, step_ms: float | None) -> tuple[int, bool]:
        """(timed steps, untimed switch step first?) of a paired unit, for a step of `step_ms`.

        `block_steps` steps, fewer when fewer already take `block_s`. A switch step absorbs the
        cold caches a block meets after another model ran; a step that alone exceeds `block_s`
        skips it: those costs are fixed (milliseconds at most) and vanish against such a step."""
        if not step_ms:
            return self.block_steps, True
        steps = max(1, min(self.block_steps, math.ceil(self.block_s * 1000.0 / step_ms)))
        return steps, step_ms <= self.block_s * 1000.0

    @property
    def rounds_floor(self) -> int:
        """Rounds measured before any stopping rule applies: a verdict needs at least this many."""
        return min(self.max_rounds, max(self.min_rounds, min_paired_rounds(self.confidence)))


@dataclass
class ComparisonRun:
    comparison: Comparison
    baseline_runs: list[TrialResult]
    candidate_runs: list[list[TrialResult]]
    """Each configuration's fresh-worker trials (the characterizing one, then process-design units)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON: {'baseline': run, 'candidates': [run + comparison fields], 'rounds', 'design', 'noise', ...}."""
        comp = self.comparison
        candidates = []
        for runs, row in zip(self.candidate_runs, comp.candidates):
            item = runs[0].to_dict()
            item.update(
                status=row.summary.status,
                median_step_ms=row.summary.median_step_ms,
                speedup=row.speedup,
                speedup_ci=list(row.speedup_ci) if row.speedup_ci else None,
                verdict=row.verdict,
                units=row.units,
                half_width=row.half_width,
                between_unit_sd=row.between_unit_sd,
                rounds_needed=row.rounds_needed,
                numerics_ok=row.numerics.ok,
                numerics=asdict(row.numerics),
                peak_memory_delta_bytes=row.peak_memory_delta_bytes,
                final_loss_delta=row.final_loss_delta,
                break_even_steps=row.break_even_steps,
                config_diff={k: list(v) for k, v in row.config_diff.items()},
                repeat_trial_ids=row.summary.trial_ids,
                utilization_summary=row.summary.utilization,
                utilization_delta=row.utilization_delta,
            )
            candidates.append(item)
        baseline = self.baseline_runs[0].to_dict()
        baseline.update(median_step_ms=comp.baseline.median_step_ms, repeat_trial_ids=comp.baseline.trial_ids)
        baseline.update(utilization_summary=comp.baseline.utilization)
        return {
            "baseline": baseline,
            "candidates": candidates,
            "rounds": comp.rounds,
            "design": comp.design,
            "paired_workers": comp.paired_workers,
            "confidence": comp.confidence,
            "precision": comp.precision,
            "equivalence_margin": comp.equivalence_margin,
            "noise": asdict(comp.noise),
            "winner": comp.winner,
            "tied": comp.tied,
            "stop_reason": comp.stop_reason,
            "elapsed_s": comp.elapsed_s,
        }


#: Settings that change what torch.compile builds but that dynamo's guards never check. Two
#: compiled configurations differing only in one of them would share one compiled graph in a
#: paired worker: dynamo keys its cache on the forward's code and guards on tensors and global
#: state, so the configuration built second reuses the graph (and the partitioning) of the first,
#: and the paired rounds time one graph on both sides. Resetting dynamo between the builds would
#: not help: the rounds alternate between the models, and whichever compiled last would serve both.
#: So such comparisons run in fresh processes, one compilation each.
UNGUARDED_BY_DYNAMO = ("activation_memory_budget",)


def paired_refusal(configs: Sequence[TrainConfig]) -> str | None:
    """Why these configurations cannot share one worker honestly (None: they can)."""
    compiled = [config for config in configs if config.compile != "off"]
    for name in UNGUARDED_BY_DYNAMO:
        values = sorted({getattr(config, name) for config in compiled})
        if len(values) > 1:
            return (
                f"the compiled configurations differ in {name} ({', '.join(map(str, values))}), which dynamo does "
                "not guard: in one worker they would all run the graph compiled first"
            )
    for config in configs:
        if config.strategy != "none":
            return f"strategy={config.strategy} runs in torchrun processes"
        if config.num_workers > 0:
            return (
                f"num_workers={config.num_workers}: the idle configurations' DataLoader workers would use the CPU "
                "while another configuration is timed"
            )
    return None


COMPARE_STEPS = 10
"""Timed steps of a comparison's fresh trials when the caller names none: the rounds, not one
long trial, give the interval, so a characterizing trial need not be long."""


def run_protocol(
    workload: Workload | str,
    baseline: TrainConfig,
    candidates: Sequence[TrainConfig],
    protocol: Protocol | None = None,
    *,
    on_event: EventSink | None = None,
    cancel: threading.Event | None = None,
    store: StoreArg = DEFAULT_STORE,
    kind: str = "compare",
    run_label: str = "",
    labels: Sequence[str] = (),
    known_baseline: Sequence[TrialResult] = (),
    request: TrialRequest | None = None,
    **trial_options: Any,
) -> ComparisonRun:
    """Characterize, then measure rounds until precise or out of budget, then compare.

    The trial options (warmup, steps, device, preset, timeout_s, ...) are `TrialRequest`'s, given
    as keywords (steps defaults to `COMPARE_STEPS`) or as one `request` whose config is ignored.
    `known_baseline`: the baseline's fresh trials from earlier (the app re-uses them; they must
    be of `baseline` with the same window). Every fresh trial is saved to `store` as it ends;
    the comparison's figures are attached to those trials when the comparison ends."""
    protocol = protocol or Protocol()
    if not candidates:
        raise ConfigError("a comparison needs at least one candidate configuration")
    configs = [baseline, *candidates]
    names = list(labels) or ["baseline", *(f"candidate {i}" for i in range(1, len(configs)))]
    refusal = paired_refusal(configs)
    if protocol.design == "paired" and refusal is not None:
        raise ConfigError(f"design='paired' is not honest here: {refusal}; use design='processes' or 'auto'")
    design = "processes" if protocol.design == "processes" or refusal is not None else "paired"
    emit = on_event or (lambda event: None)
    requests = configured_requests(workload, configs, names, request, trial_options)
    began = time.monotonic()
    load = HostLoad().start()
    spares = len(configs) - bool(known_baseline) + (protocol.paired_workers if design == "paired" else 0)
    with opened_store(store) as history, _spare_workers(requests[0], design, spares):
        recorder = history.recorder(kind, label=run_label) if history is not None else None

        def fresh(index: int) -> TrialResult:
            result = run_request(requests[index], on_event, cancel)
            if recorder is not None:
                recorder.save(result, label=names[index])
            return result

        runs: list[list[TrialResult]] = [list(known_baseline)] + [[] for _ in candidates]
        for index in range(len(configs)):
            if not runs[index]:
                runs[index].append(fresh(index))
        rounds = _Rounds(requests, runs, protocol, design, began, emit, cancel, fresh)
        log, stop_reason = rounds.run()
        design = rounds.design
        discard_spares()  # reaped before the host-load reading, so their start-up is not "other" work
        summaries = [summarize(r) for r in runs]
        numerics = [check_numerics(runs[0][0], r[0]) for r in runs[1:]]
        comparison = compare_units(summaries, numerics, log, paired=design == "paired", design=design,
                                   confidence=protocol.confidence, equivalence_margin=protocol.margin,
                                   precision=protocol.precision, host_other_cores=load.other_cores(),
                                   baseline_steps=runs[0][0].step_ms, paired_workers=rounds.workers)  # fmt: skip
        comparison.stop_reason = stop_reason
        comparison.elapsed_s = time.monotonic() - began
        if history is not None:
            _attach(history, comparison, runs)
    return ComparisonRun(comparison, runs[0], runs[1:])


def configured_requests(
    workload: Workload | str,
    configs: Sequence[TrainConfig],
    names: Sequence[str],
    request: TrialRequest | None,
    options: dict[str, Any],
) -> list[TrialRequest]:
    """One resolved request per configuration, all of one window: the device settled and each config
    checked on it once, before anything is measured (a candidate this device cannot run is refused
    before the baseline's trial, not after it)."""
    if request is None:
        request = TrialRequest.of(workload, configs[0], **{"steps": COMPARE_STEPS, **options})
    elif options:
        raise ConfigError(f"give the trial options in `request` or as keywords, not both (got {', '.join(options)})")
    requests = []
    for index, config in enumerate(configs):
        try:
            requests.append(replace(request, workload=workload).with_config(config).resolved())
        except ConfigError as exc:
            raise ConfigError(f"{names[index] if index < len(names) else f'configuration {index}'}: {exc}") from None
    return requests


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
    requests = [TrialRequest.of(workload, config, **window).resolved() for config in configs]
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


class _Rounds:
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
            shapes = {local[i]: self.protocol.block_for(self.runs[i][0].median_step_ms) for i in ok}

            def one_round(number: int, members: list[int]) -> dict[int, list[float]]:
                # Worker number mod n; within a worker the order still alternates from one of its rounds to the next.
                session = sessions[number % len(sessions)]
                order = round_order(members, number // len(sessions))
                blocks = session.run_round([local[i] for i in order], shapes)
                return {ok[position]: step_ms for position, step_ms in blocks.items()}

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
                raise _RoundFailed(f"{result.status} in a later round of config {index}: {result.message[:120]}")
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
            try:
                blocks = measure(number, [0, *active])
            except _RoundFailed as exc:
                return f"stopped: {exc}"
            durations.append(time.monotonic() - round_began)
            for index, step_ms in blocks.items():
                self.log.add(index, number, step_ms)
            number += 1
            widths = self._half_widths(ok)
            if number >= p.rounds_floor:
                active = [i for i in active if widths[i] is None or widths[i] > p.precision]  # type: ignore[operator]
            self.emit(RoundMeasured(number, self.design, blocks, widths, p.precision, time.monotonic() - self.began,
                                    p.budget_s))  # fmt: skip

    def _half_widths(self, ok: list[int]) -> dict[int, float | None]:
        from workbench.analysis.compare import estimate

        paired = self.design == "paired"
        widths: dict[int, float | None] = {}
        for index in ok:
            if index == 0:
                continue
            est = estimate(self.log, 0, index, paired=paired, confidence=self.protocol.confidence)
            widths[index] = est.half_width if est is not None else None
        return widths


@contextlib.contextmanager
def _spare_workers(request: TrialRequest, design: str, count: int) -> Iterator[None]:
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


class _RoundFailed(Exception):
    """A unit of a later round failed (the characterizing trial had succeeded)."""


def _attach(history: Any, comparison: Comparison, runs: list[list[TrialResult]]) -> None:
    """The verdicts onto the stored trials, so `history` shows them with the trial."""
    common = {"design": comparison.design, "paired_workers": comparison.paired_workers,
              "rounds": comparison.rounds, "precision": comparison.precision,
              "confidence": comparison.confidence, "noise": asdict(comparison.noise),
              "stop_reason": comparison.stop_reason}  # fmt: skip
    figures: list[dict[str, Any]] = [{"role": "baseline", **common}]
    for row in comparison.candidates:
        figures.append({"role": "candidate", "speedup": row.speedup, "speedup_ci": row.speedup_ci,
                        "verdict": row.verdict, "units": row.units, "half_width": row.half_width, **common})  # fmt: skip
    for config_runs, data in zip(runs, figures):
        for result in config_runs:
            result.comparison = data
            try:
                history.attach_comparison(result.trial_id, data)
            except KeyError:  # a known baseline from another store or none at all
                pass
