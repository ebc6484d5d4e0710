"""What "best" means to the tuner, as pure rules over measured results.

- Throughput per sample when the samples per step differ (a bigger batch is slower per step
  and may still be faster per sample); step time otherwise.
- Compile/capture time amortized over the user's planned steps: a compile that never pays
  back within the run the user will train is not a win.
- The numerics guard must pass; the peak memory must stay within the limit; the memory
  estimate decides first whether a configuration is worth a trial at all.
The statistics themselves are the protocol's (`analysis.compare`); these rules only rescale
its speedups and intervals into the objective's units.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from workbench.analysis.compare import DEFAULT_PLANNED_STEPS as DEFAULT_PLANNED_STEPS
from workbench.analysis.compare import CandidateComparison, TrialSummary
from workbench.analysis.intervals import SpeedupEstimate, verdict_for
from workbench.analysis.numerics import check_numerics
from workbench.config import ConfigError
from workbench.measure.result import TrialResult

ObjectiveKind = Literal["step-time", "throughput"]


@dataclass(frozen=True)
class Objective:
    kind: ObjectiveKind = "throughput"
    planned_steps: int = DEFAULT_PLANNED_STEPS
    max_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("step-time", "throughput"):
            raise ConfigError(f"objective must be 'step-time' or 'throughput', got {self.kind!r}")
        if isinstance(self.planned_steps, bool) or not isinstance(self.planned_steps, int) or self.planned_steps < 1:
            raise ConfigError(f"planned steps must be a whole number >= 1, got {self.planned_steps!r}")
        if self.max_memory_bytes is not None and self.max_memory_bytes <= 0:
            raise ConfigError(f"max memory must be a positive size such as 20GiB, got {self.max_memory_bytes!r}")

    @property
    def unit(self) -> str:
        return "ms/sample" if self.kind == "throughput" else "ms/step"


@dataclass
class Outcome:
    """One screening trial judged: its objective value (lower is better) or why it has none."""

    status: str
    """'ok', a trial status ('error', 'oom', 'timeout', 'diverged', 'cancelled'), 'pruned',
    'over-memory' (measured peak above the limit), 'numerics' (losses left the baseline's)."""
    cost_ms: float | None
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.status == "ok" and self.cost_ms is not None


def choose_kind(requested: str | None, samples_vary: bool) -> ObjectiveKind:
    """'throughput' when batch sizes vary (step times of different batches do not compare)."""
    if requested in (None, "auto"):
        return "throughput" if samples_vary else "step-time"
    if requested == "step-time" and samples_vary:
        raise ConfigError(
            "objective step-time cannot rank different batch sizes (a bigger batch is slower per step); "
            "use --objective throughput, fix batch_size in the space, or keep the global batch with --global-batch"
        )
    if requested not in ("step-time", "throughput"):
        raise ConfigError(f"objective must be 'step-time' or 'throughput', got {requested!r}")
    return requested  # type: ignore[return-value]


def amortized_step_ms(step_ms: float, compile_time_s: float, planned_steps: int) -> float:
    """The step time a user's run of `planned_steps` steps really pays: one compile spread over it."""
    return step_ms + 1000.0 * max(0.0, compile_time_s) / planned_steps


def cost_ms(result: TrialResult, objective: Objective) -> float | None:
    """The objective's value of one trial (ms per step, or per sample), compile amortized."""
    median = result.median_step_ms
    if median is None:
        return None
    step = amortized_step_ms(median, result.compile_time_s, objective.planned_steps)
    if objective.kind == "throughput":
        return step / max(1, result.samples_per_step)
    return step


def memory_refusal(peak_bytes: int | None, objective: Objective, *, estimated: bool = False) -> str:
    """Why this peak breaks the limit ('' when it does not, or when no limit was given)."""
    limit = objective.max_memory_bytes
    if limit is None or peak_bytes is None or peak_bytes <= limit:
        return ""
    from workbench.textfmt import format_bytes

    what = "estimated peak" if estimated else "measured peak"
    return f"{what} {format_bytes(peak_bytes)} exceeds the limit {format_bytes(limit)}"


def judge(result: TrialResult, baseline: TrialResult, objective: Objective) -> Outcome:
    """A screening trial's outcome: failures keep their status and message, then the numerics
    guard, then the memory limit, then the amortized cost."""
    if result.status == "cancelled" and result.message.startswith("pruned"):
        return Outcome("pruned", None, result.message)
    if not result.ok:
        return Outcome(result.status, None, _first_line(result.message) or result.status)
    numerics = check_numerics(baseline, result)
    if numerics.ok is False:
        return Outcome("numerics", None, f"losses left the baseline's: {numerics.note}")
    refusal = memory_refusal(result.peak_memory_bytes, objective)
    if refusal:
        return Outcome("over-memory", None, refusal)
    cost = cost_ms(result, objective)
    if cost is None:
        return Outcome("error", None, "no timed step")
    return Outcome("ok", cost)


def objective_row(
    row: CandidateComparison,
    baseline: TrialSummary,
    objective: Objective,
    *,
    margin: float,
    precision: float | None,
) -> CandidateComparison:
    """The protocol's row in the objective's units: its step-time speedup and interval scaled by
    the samples per step (throughput) and by each side's compile amortized over the planned
    steps, the verdict re-read from the scaled interval by the protocol's own rule.

    The scaling is monotonic in the speedup, so the interval's coverage is the protocol's."""
    if row.speedup is None or baseline.median_step_ms is None:
        return row
    base_step = baseline.median_step_ms
    base_cost = amortized_step_ms(base_step, baseline.compile_time_s, objective.planned_steps)
    samples = _samples_ratio(row.summary, baseline) if objective.kind == "throughput" else 1.0

    def scaled(speedup: float) -> float:
        cand_cost = amortized_step_ms(base_step / speedup, row.summary.compile_time_s, objective.planned_steps)
        return base_cost / cand_cost * samples

    ci = (scaled(row.speedup_ci[0]), scaled(row.speedup_ci[1])) if row.speedup_ci else None
    estimate = SpeedupEstimate(scaled(row.speedup), ci, row.units, True, row.between_unit_sd)
    verdict = row.verdict if row.verdict == "failed" else verdict_for(estimate, margin, precision)
    return dataclasses.replace(row, speedup=estimate.speedup, speedup_ci=ci, verdict=verdict,
                               half_width=estimate.half_width)  # fmt: skip


def pareto_front(points: list[tuple[float, int]]) -> list[int]:
    """Indices of the non-dominated (cost, peak memory) points: nothing else is at least as good
    on both and better on one. Lower is better on both axes."""
    front = []
    for i, (cost, peak) in enumerate(points):
        dominated = any(
            (c <= cost and p <= peak) and (c < cost or p < peak) for j, (c, p) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _samples_ratio(candidate: TrialSummary, baseline: TrialSummary) -> float:
    """Candidate samples per step ÷ the baseline's (throughput figures carry both)."""
    cand = _samples(candidate)
    base = _samples(baseline)
    return cand / base if cand and base else 1.0


def _samples(summary: TrialSummary) -> float | None:
    if summary.throughput is None or summary.median_step_ms is None:
        return None
    return summary.throughput * summary.median_step_ms / 1000.0


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
