"""Comparison as a statistical statement: speedup with a bootstrap interval, a verdict, numerics.

Pure functions over `TrialResult`s, returning dataclasses. Repeats of one
configuration are pooled. The interval is scipy's bootstrap of the ratio of median
step times; a verdict needs the interval to exclude 1.0 *and* the effect to clear a
small equivalence margin — separate trials on one machine drift by about that much,
which per-step resampling cannot see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from workbench.analysis.numerics import NumericsCheck, check_numerics
from workbench.config import TrainConfig
from workbench.measure.result import TrialResult

Verdict = Literal["faster", "slower", "no significant difference", "failed"]


@dataclass
class TrialSummary:
    """One configuration's pooled figures (over its repeats)."""

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


@dataclass
class CandidateComparison:
    summary: TrialSummary
    speedup: float | None
    """Baseline median step time ÷ candidate median step time (>1 is faster)."""
    speedup_ci: tuple[float, float] | None
    verdict: Verdict
    peak_memory_delta_bytes: int | None
    final_loss_delta: float | None
    numerics: NumericsCheck
    break_even_steps: float | None
    """Steps until the one-time compile/capture cost is paid back; None when it never is."""
    config_diff: dict[str, tuple[Any, Any]]

    @property
    def numerics_ok(self) -> bool | None:
        return self.numerics.ok


@dataclass
class Comparison:
    baseline: TrialSummary
    candidates: list[CandidateComparison]
    repeats: int
    confidence: float
    equivalence_margin: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_trials(
    baseline: TrialResult | Sequence[TrialResult],
    candidates: Sequence[TrialResult | Sequence[TrialResult]],
    *,
    confidence: float = 0.95,
    equivalence_margin: float = 0.02,
    n_resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Compare each candidate (or its repeats) with the baseline (or its repeats)."""
    base_runs = _as_runs(baseline)
    base = summarize(base_runs)
    rows = [_compare_one(base_runs, _as_runs(c), confidence, equivalence_margin, n_resamples, seed) for c in candidates]
    return Comparison(base, rows, repeats=len(base_runs), confidence=confidence, equivalence_margin=equivalence_margin)


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
    )


def speedup_interval(
    baseline_ms: np.ndarray, candidate_ms: np.ndarray, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap interval of median(baseline) / median(candidate) (scipy, percentile method)."""
    from scipy.stats import bootstrap

    def ratio(b: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(b, axis=axis) / np.median(c, axis=axis)

    res = bootstrap(
        (baseline_ms, candidate_ms),
        ratio,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def verdict_for(ci: tuple[float, float], speedup: float, margin: float) -> Verdict:
    low, high = ci
    if low > 1.0 and speedup > 1.0 + margin:
        return "faster"
    if high < 1.0 and speedup < 1.0 / (1.0 + margin):
        return "slower"
    return "no significant difference"


# --- internals ----------------------------------------------------------------------


def _compare_one(
    base_runs: list[TrialResult],
    cand_runs: list[TrialResult],
    confidence: float,
    margin: float,
    n_resamples: int,
    seed: int,
) -> CandidateComparison:
    base, cand = summarize(base_runs), summarize(cand_runs)
    diff = TrainConfig.from_dict(base.config).diff(TrainConfig.from_dict(cand.config))
    b_steps, c_steps = _pooled_steps([r for r in base_runs if r.ok]), _pooled_steps([r for r in cand_runs if r.ok])
    # Same seed and batches in every repeat: the first run of each stands for its losses.
    numerics = check_numerics(base_runs[0], cand_runs[0])
    if base.status != "ok" or cand.status != "ok" or not b_steps.size or not c_steps.size:
        return CandidateComparison(cand, None, None, "failed", None, None, numerics, None, diff)
    speedup = float(np.median(b_steps) / np.median(c_steps))
    ci = speedup_interval(b_steps, c_steps, confidence, n_resamples, seed)
    return CandidateComparison(
        summary=cand,
        speedup=speedup,
        speedup_ci=ci,
        verdict=verdict_for(ci, speedup, margin),
        peak_memory_delta_bytes=_delta(cand.peak_memory_bytes, base.peak_memory_bytes),
        final_loss_delta=_delta(cand.final_loss, base.final_loss),
        numerics=numerics,
        break_even_steps=_break_even(base, cand),
        config_diff=diff,
    )


def _break_even(base: TrialSummary, cand: TrialSummary) -> float | None:
    if not cand.compile_time_s or base.median_step_ms is None or cand.median_step_ms is None:
        return None
    saving_s = (base.median_step_ms - cand.median_step_ms) / 1000.0
    if saving_s <= 0:
        return None
    return max(0.0, cand.compile_time_s - base.compile_time_s) / saving_s


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
