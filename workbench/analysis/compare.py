"""Comparison as a statistical statement: speedup with an interval over independent units, a verdict, numerics.

Pure functions over measured units, returning dataclasses. A unit is one fresh worker's
trial or one paired round (`analysis.intervals` says why the step is never the unit);
`compare_units` turns per-unit median step times into speedups, verdicts, the noise
figures and the winner, and `compare_trials` does so for plain lists of trials (each trial
one unit), as `regress` and the run history need. The protocol that *measures* the units
(`workbench.protocol`) calls `compare_units` after every round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from workbench.analysis.hostshift import LoadShift, load_shift
from workbench.analysis.intervals import (
    SpeedupEstimate,
    Verdict,
    paired_speedup,
    robust_cv,
    rounds_needed,
    unpaired_speedup,
    verdict_for,
)
from workbench.analysis.layout_cost import layout_cost
from workbench.analysis.numerics import NumericsCheck, check_numerics
from workbench.analysis.utilization import summarize_utilization, utilization_delta
from workbench.config import TrainConfig
from workbench.measure.result import TrialResult

__all__ = ["Comparison", "Noise", "UnitLog", "Verdict", "compare_trials", "compare_units", "pick_winner", "summarize"]

HOST_BUSY_CORES = 0.3
"""Average cores used by other processes during a comparison above which it carries a warning."""
DEFAULT_PLANNED_STEPS = 10_000
"""Steps of the user's real run that one compile is spread over, unless they say otherwise (the
tuner's amortized cost and the diagnosis's compile payback read the same number)."""


@dataclass
class TrialSummary:
    """One configuration's figures from its fresh-worker trials (pooled over its repeats)."""

    label: str
    config: dict[str, Any]
    status: str
    message: str
    repeats: int
    median_step_ms: float | None
    iqr_step_ms: float | None
    throughput: float | None
    peak_memory_bytes: int | None
    time_to_first_step_s: float | None
    compile_time_s: float
    final_loss: float | None
    trial_ids: list[str] = field(default_factory=list)
    utilization: dict[str, Any] | None = None
    layout: dict[str, Any] | None = None
    """Distributed runs: parameters per rank and collectives per step (`layout_cost`)."""
    """The timed windows' utilization and energy, each figure's median over the trials
    (`analysis.utilization.FIGURES`); None for trials recorded without them."""


@dataclass
class CandidateComparison:
    summary: TrialSummary
    speedup: float | None
    """Baseline step time ÷ candidate step time (>1 is faster), geometric mean over the units."""
    speedup_ci: tuple[float, float] | None
    verdict: Verdict
    peak_memory_delta_bytes: int | None
    final_loss_delta: float | None
    numerics: NumericsCheck
    break_even_steps: float | None
    """Steps until the one-time compile/capture cost is paid back; None when it never is."""
    config_diff: dict[str, tuple[Any, Any]]
    units: int = 0
    """Independent units (paired rounds, or trials per side) behind the interval."""
    half_width: float | None = None
    """The interval's relative half-width (0.03 = ±3%)."""
    between_unit_sd: float | None = None
    """Unit-to-unit standard deviation of the (log) ratio: the noise the interval had to beat."""
    rounds_needed: int | None = None
    """Further units the precision target needs, by this noise (None: cannot tell yet)."""
    utilization_delta: dict[str, float | None] | None = None
    """Candidate minus baseline for each utilization and energy figure."""
    load_changed_rounds: list[int] = field(default_factory=list)
    """Paired rounds in which the host's load changed (`analysis.hostshift`): set aside from the
    interval; when too many, the verdict is "inconclusive"."""
    verdict_note: str = ""
    """Why the verdict was withheld where the numbers alone do not say ('' when it was not): "the
    host's load changed during the comparison, N of M rounds affected"."""
    interval_confidence: float | None = None
    """The interval's confidence where it is not the comparison's: 0.99 on a busy host
    (`hostshift.BUSY_CONFIDENCE`); None otherwise."""

    @property
    def numerics_ok(self) -> bool | None:
        return self.numerics.ok


@dataclass
class Noise:
    """How noisy the measurement was, so a user can tell a quiet verdict from a lucky one."""

    within_unit_cv: float | None
    """Step-to-step spread inside a unit (robust CV of the baseline's steps, median over units)."""
    between_unit_sd: float | None
    """Largest unit-to-unit spread of a candidate's log ratio (paired) or log medians (unpaired)."""
    baseline_drift: float | None
    """Spread of the baseline's own unit medians over the comparison (how much the machine moved)."""
    host_other_cores: float | None = None
    """Average CPU cores used by other processes while measuring (None: not sampled)."""
    between_workers: float | None = None
    """Paired rounds rotated between workers: the largest gap between two workers' median log
    ratios, over the candidates (0.03 ≈ 3%): what one worker alone would have shown as an effect."""
    warnings: list[str] = field(default_factory=list)
    load_changed_rounds: list[int] = field(default_factory=list)
    """Paired rounds in which the host's load changed, over every candidate (set aside)."""
    usual_load_cores: float | None = None
    """The host's load in a usual round (median, other processes' cores; None: not measured per round)."""
    load_changes: list[dict[str, Any]] = field(default_factory=list)
    """Each affected round: {round, at_s (seconds into the comparison), baseline_cores, candidate_cores
    (the most-loaded candidate's)}: when the load changed, and by how much."""


@dataclass
class Comparison:
    baseline: TrialSummary
    candidates: list[CandidateComparison]
    rounds: int
    """Units measured for the baseline (paired rounds, or trials)."""
    confidence: float
    equivalence_margin: float
    design: str = "processes"
    """'paired': rounds of blocks in workers that hold every configuration; 'processes': one fresh worker per unit."""
    paired: bool = False
    paired_workers: int = 0
    """Paired design: how many workers the rounds rotated between (0: the processes design)."""
    precision: float | None = None
    noise: Noise = field(default_factory=lambda: Noise(None, None, None))
    winner: int | None = None
    """Index into `candidates` of the fastest candidate that is significantly faster with sound
    numerics; None when none is."""
    tied: list[int] = field(default_factory=list)
    """Other candidates not significantly slower than the winner (the top is a tie among these)."""
    stop_reason: str = ""
    elapsed_s: float | None = None
    bounds: list[CandidateComparison] = field(default_factory=list)
    """Rows measured beside the candidates that are bounds, not configurations to choose: the
    ideal loader (the baseline's step on batches staged on the device), when asked for."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class UnitLog:
    """Per configuration (0 = baseline), each unit's median step time keyed by round, and the
    unit's step times (for the within-unit spread)."""

    medians: dict[int, dict[int, float]] = field(default_factory=dict)
    steps: dict[int, list[list[float]]] = field(default_factory=dict)
    loads: dict[int, dict[int, tuple[float | None, float | None]]] = field(default_factory=dict)
    """Per configuration and round, the host's load while that unit was timed: (other processes'
    busy cores, our threads' run-queue wait per second); absent where it was not measured."""
    began_s: dict[int, float] = field(default_factory=dict)
    """Each round's start, seconds into the comparison (where known): when a load change happened."""

    def add(
        self,
        config: int,
        round_index: int,
        step_ms: Sequence[float],
        load: tuple[float | None, float | None] | None = None,
    ) -> None:
        if not step_ms:
            return
        self.medians.setdefault(config, {})[round_index] = float(np.median(step_ms))
        self.steps.setdefault(config, []).append([float(x) for x in step_ms])
        if load is not None:
            self.loads.setdefault(config, {})[round_index] = load

    def units(self, config: int) -> int:
        return len(self.medians.get(config, {}))


def estimate(
    log: UnitLog, a: int, b: int, *, paired: bool, confidence: float, set_aside: bool = True
) -> SpeedupEstimate | None:
    """Config `a`'s time ÷ config `b`'s time over their units; None when either has none.

    Paired: the rounds in which the host's load changed (`shift`) are left out when `set_aside`,
    and on a busy host the interval is taken at `LoadShift.confidence` (99%)."""
    ma, mb = log.medians.get(a, {}), log.medians.get(b, {})
    if not ma or not mb or (paired and not set(ma) & set(mb)):
        return None
    if paired:
        if set_aside:
            moved = shift(log, a, b)
            ma = {r: v for r, v in ma.items() if r not in set(moved.rounds)}
            confidence = moved.confidence(confidence)
            if not set(ma) & set(mb):
                return None
        return paired_speedup(ma, mb, confidence)
    return unpaired_speedup(list(ma.values()), list(mb.values()), confidence)


def shift(log: UnitLog, a: int, b: int) -> LoadShift:
    """The paired rounds of configs `a` and `b` in which the host's load changed."""
    rounds = sorted(set(log.medians.get(a, {})) & set(log.medians.get(b, {})))
    return load_shift(log.loads.get(a, {}), log.loads.get(b, {}), rounds)


def compare_units(
    summaries: Sequence[TrialSummary],
    numerics: Sequence[NumericsCheck],
    log: UnitLog,
    *,
    paired: bool,
    design: str,
    confidence: float = 0.95,
    equivalence_margin: float = 0.02,
    precision: float | None = None,
    host_other_cores: float | None = None,
    baseline_steps: Sequence[float] = (),
    paired_workers: int = 0,
    bound_rows: int = 0,
) -> Comparison:
    """The comparison of candidates 1..n with the baseline 0 from their units' medians.

    `summaries[i]` carries config i's fresh-trial figures (memory, compile, status),
    `numerics[i - 1]` candidate i's loss check against the baseline. `baseline_steps` (the
    baseline's fresh trial) gives the step-to-step spread where units are single steps.
    `paired_workers`: paired round r was measured in worker r mod that many. The last `bound_rows`
    configurations are bounds (the ideal loader): compared with the baseline like candidates, but
    kept apart in `Comparison.bounds`, never a winner."""
    base = summaries[0]
    rows = []
    for index, (summary, check) in enumerate(zip(summaries[1:], numerics), start=1):
        est, moved = None, LoadShift()
        if base.status == "ok" and summary.status == "ok":
            est = estimate(log, 0, index, paired=paired, confidence=confidence)
            moved = shift(log, 0, index) if paired else moved
        rows.append(_row(base, summary, check, est, equivalence_margin, precision, confidence, moved))
    bounds = rows[len(rows) - bound_rows :] if bound_rows else []
    candidates = rows[: len(rows) - bound_rows]
    winner, tied = _winner(candidates, log, paired, confidence, equivalence_margin)
    return Comparison(
        baseline=base,
        candidates=candidates,
        bounds=bounds,
        rounds=log.units(0),
        confidence=confidence,
        equivalence_margin=equivalence_margin,
        design=design,
        paired=paired,
        paired_workers=paired_workers,
        precision=precision,
        noise=_with_load_changes(
            _noise(log, rows, host_other_cores, baseline_steps, paired_workers if paired else 0), log, len(rows)
        ),
        winner=winner,
        tied=tied,
    )


def compare_trials(
    baseline: TrialResult | Sequence[TrialResult],
    candidates: Sequence[TrialResult | Sequence[TrialResult]],
    *,
    confidence: float = 0.95,
    equivalence_margin: float = 0.02,
) -> Comparison:
    """Compare each candidate's trials with the baseline's, each trial one independent unit.

    Trials from different processes are not paired (Welch's interval over their medians):
    fewer than `intervals.MIN_UNITS` trials a side is "inconclusive"."""
    groups = [_as_runs(baseline), *(_as_runs(c) for c in candidates)]
    log = UnitLog()
    for index, runs in enumerate(groups):
        for position, run in enumerate(r for r in runs if r.ok):
            log.add(index, position, run.step_ms)
    # Same seed and batches in every repeat: the first run of each stands for its losses.
    numerics = [check_numerics(groups[0][0], runs[0]) for runs in groups[1:]]
    return compare_units([summarize(g) for g in groups], numerics, log, paired=False, design="processes",
                         confidence=confidence, equivalence_margin=equivalence_margin)  # fmt: skip


def summarize(runs: Sequence[TrialResult]) -> TrialSummary:
    ok = [r for r in runs if r.ok]
    steps = _pooled_steps(ok)
    first = runs[0]
    failed = next((r for r in runs if not r.ok), None)
    peaks = [r.peak_memory_bytes for r in ok if r.peak_memory_bytes is not None]
    firsts = [r.time_to_first_step_s for r in ok if r.time_to_first_step_s is not None]
    return TrialSummary(
        label=TrainConfig.from_dict(first.config).describe(),
        config=first.config,
        status=failed.status if failed else "ok",
        message=failed.message if failed else "",
        repeats=len(runs),
        median_step_ms=float(np.median(steps)) if steps.size else None,
        iqr_step_ms=float(np.subtract(*np.percentile(steps, [75, 25]))) if steps.size else None,
        throughput=_throughput(ok, steps),
        peak_memory_bytes=max(peaks) if peaks else None,
        time_to_first_step_s=float(np.median(firsts)) if firsts else None,
        compile_time_s=float(np.median([r.compile_time_s for r in ok])) if ok else 0.0,
        final_loss=ok[0].final_loss if ok else None,
        trial_ids=[r.trial_id for r in runs],
        utilization=summarize_utilization(ok),
        layout=layout_cost(ok),
    )


# --- internals ----------------------------------------------------------------------


def _row(
    base: TrialSummary,
    cand: TrialSummary,
    numerics: NumericsCheck,
    est: SpeedupEstimate | None,
    margin: float,
    precision: float | None,
    confidence: float,
    moved: LoadShift | None = None,
) -> CandidateComparison:
    diff = TrainConfig.from_dict(base.config).diff(TrainConfig.from_dict(cand.config))
    moved = moved or LoadShift()
    if est is None:  # failed to run, or (rare) ran but no unit was timed: say which
        verdict: Verdict = "inconclusive" if base.status == cand.status == "ok" else "failed"
        return CandidateComparison(
            cand,
            None,
            None,
            verdict,
            None,
            None,
            numerics,
            None,
            diff,
            utilization_delta=utilization_delta(base.utilization, cand.utilization),
            load_changed_rounds=moved.rounds,
            verdict_note=moved.note() if moved.withheld else "",
        )
    return CandidateComparison(
        summary=cand,
        speedup=est.speedup,
        speedup_ci=est.ci,
        # Withheld, not guessed: the rounds left may not be the quiet ones they look like.
        verdict="inconclusive" if moved.withheld else verdict_for(est, margin, precision),
        peak_memory_delta_bytes=_delta(cand.peak_memory_bytes, base.peak_memory_bytes),
        final_loss_delta=_delta(cand.final_loss, base.final_loss),
        numerics=numerics,
        break_even_steps=_break_even(base, cand, est.speedup),
        config_diff=diff,
        units=est.units,
        half_width=est.half_width,
        between_unit_sd=est.log_sd,
        rounds_needed=rounds_needed(est, precision, moved.confidence(confidence)) if precision else None,
        utilization_delta=utilization_delta(base.utilization, cand.utilization),
        load_changed_rounds=moved.rounds,
        verdict_note=moved.note() if moved.withheld else "",
        interval_confidence=moved.confidence(confidence) if moved.confidence(confidence) != confidence else None,
    )


def pick_winner(rows: Sequence[CandidateComparison], beats: Any = None) -> tuple[int | None, list[int]]:
    """The winner rule: the fastest significantly-faster candidate with sound numerics, and the
    other eligible candidates it does not significantly beat (a tie at the top).

    `beats(best, other)` judges head to head on shared units when the candidates were measured
    in one comparison; without it (rows from separate comparisons against the same baseline)
    two candidates tie when their intervals overlap."""
    eligible = [i for i, r in enumerate(rows) if r.verdict == "faster" and r.numerics.ok is not False]
    if not eligible:
        return None, []
    best = max(eligible, key=lambda i: rows[i].speedup or 0.0)
    tied = []
    for other in eligible:
        if other == best:
            continue
        if beats is not None:
            if not beats(best, other):
                tied.append(other)
        elif _overlap(rows[best].speedup_ci, rows[other].speedup_ci):
            tied.append(other)
    return best, tied


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


def _winner(
    rows: list[CandidateComparison], log: UnitLog, paired: bool, confidence: float, margin: float
) -> tuple[int | None, list[int]]:
    """`pick_winner`, head to head on this comparison's units (overlapping intervals against the
    baseline would call close calls ties too often)."""

    def beats(best: int, other: int) -> bool:
        # Units are keyed by config index: candidate i is config i + 1.
        head = estimate(log, other + 1, best + 1, paired=paired, confidence=confidence)
        return head is not None and verdict_for(head, margin) == "faster"

    return pick_winner(rows, beats)


def _noise(
    log: UnitLog,
    rows: list[CandidateComparison],
    host_other_cores: float | None,
    baseline_steps: Sequence[float],
    workers: int,
) -> Noise:
    cvs = [cv for steps in log.steps.get(0, []) if (cv := robust_cv(steps)) is not None]
    if not cvs and (cv := robust_cv(list(baseline_steps))) is not None:  # one-step units: a slow step
        cvs = [cv]
    sds = [r.between_unit_sd for r in rows if r.between_unit_sd is not None]
    base = list(log.medians.get(0, {}).values())
    drift = float(np.std(np.log(base), ddof=1)) if len(base) >= 2 else None
    warnings = []
    if host_other_cores is not None and host_other_cores > HOST_BUSY_CORES:
        warnings.append(
            f"the host was busy: other processes used {host_other_cores:.1f} CPU cores on average while measuring; "
            "paired rounds cancel a load that hits both arms alike (rounds where it did not are set aside, below) but "
            "intervals are wider — measure on a quiet machine"
        )
    return Noise(float(np.median(cvs)) if cvs else None, max(sds) if sds else None, drift, host_other_cores,
                 _between_workers(log, len(rows), workers), warnings)  # fmt: skip


def _with_load_changes(noise: Noise, log: UnitLog, candidates: int) -> Noise:
    """`noise` with the rounds in which the host's load changed (any candidate), when and how much."""
    moved = [shift(log, 0, index) for index in range(1, candidates + 1)]
    rounds = sorted({r for m in moved for r in m.rounds})
    if not rounds:
        noise.usual_load_cores = next((m.usual for m in moved if m.usual is not None), None)
        return noise
    noise.load_changed_rounds = rounds
    noise.usual_load_cores = next(m.usual for m in moved if m.usual is not None)
    for r in rounds:
        pairs = [m.loads[r] for m in moved if r in m.loads]
        change = {"round": r, "at_s": log.began_s.get(r), "baseline_cores": pairs[0][0]}
        change["candidate_cores"] = max(pair[1] for pair in pairs)
        noise.load_changes.append(change)
    most = max(max(c["baseline_cores"], c["candidate_cores"]) for c in noise.load_changes)
    withheld = any(m.withheld for m in moved)
    times = [c["at_s"] for c in noise.load_changes if c["at_s"] is not None]
    when = f", {min(times):.0f}–{max(times):.0f} s in" if times else ""
    noise.warnings.append(
        f"the host's load changed during the comparison: in {len(rounds)} of {max(m.measured for m in moved)} "
        f"rounds ({_spans(rounds)}{when}) other work used up to {most:.1f} cores against the usual "
        f"{noise.usual_load_cores:.1f}; "
        + ("too many to trust the rest: verdict withheld (inconclusive)" if withheld else "those rounds are set aside")
    )
    return noise


def _spans(rounds: list[int]) -> str:
    """[3, 4, 5, 9] → 'rounds 3–5, 9'."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return "rounds " + ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in spans)


def _between_workers(log: UnitLog, candidates: int, workers: int) -> float | None:
    """Largest gap between two workers' median log ratios (round r in worker r mod `workers`)."""
    if workers < 2:
        return None
    base = log.medians.get(0, {})
    gaps = []
    for index in range(1, candidates + 1):
        cand = log.medians.get(index, {})
        by_worker: dict[int, list[float]] = {}
        for r in set(base) & set(cand):
            by_worker.setdefault(r % workers, []).append(math.log(base[r] / cand[r]))
        if len(by_worker) >= 2:
            medians = [float(np.median(v)) for v in by_worker.values()]
            gaps.append(max(medians) - min(medians))
    return max(gaps) if gaps else None


def _break_even(base: TrialSummary, cand: TrialSummary, speedup: float) -> float | None:
    """Compile cost ÷ the per-step saving the calibrated speedup implies on the baseline's step."""
    if not cand.compile_time_s or base.median_step_ms is None:
        return None
    return break_even_steps(base.median_step_ms, speedup, cand.compile_time_s - base.compile_time_s)


def break_even_steps(base_step_ms: float, speedup: float, extra_compile_s: float) -> float | None:
    """Steps a run needs before a `speedup` on a `base_step_ms` step has paid `extra_compile_s` of
    compile back; None when the candidate is not faster (it never pays back)."""
    saving_s = base_step_ms * (1.0 - 1.0 / speedup) / 1000.0 if speedup > 0 else 0.0
    if saving_s <= 0:
        return None
    return max(0.0, extra_compile_s) / saving_s


def _pooled_steps(runs: Sequence[TrialResult]) -> np.ndarray:
    return np.asarray([t for r in runs for t in r.step_ms], dtype=float)


def _throughput(runs: Sequence[TrialResult], steps: np.ndarray) -> float | None:
    if not runs or not steps.size or not runs[0].samples_per_step:
        return None
    return runs[0].samples_per_step / (float(np.median(steps)) / 1000.0)


def _delta(a: float | None, b: float | None) -> Any:
    return None if a is None or b is None else a - b


def _as_runs(item: TrialResult | Sequence[TrialResult]) -> list[TrialResult]:
    runs = [item] if isinstance(item, TrialResult) else list(item)
    if not runs:
        raise ValueError("a comparison needs at least one trial per configuration")
    return runs
