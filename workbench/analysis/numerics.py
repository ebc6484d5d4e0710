"""The numerics guard: did the candidate train like the baseline (same seed, same batches)?

Two checks, because training trajectories are chaotic: a rounding difference at step 2
becomes a 20% difference in one batch's loss by step 20 even for a correct change
(measured here: fp32 channels_last on the BEV workload). So
- the first steps (initial weights, one or two updates) must agree within a tolerance
  that fits the least precise dtype of the pair: numerics, not chaos;
- the loss level over the last quarter must agree within a looser band: a broken
  optimization (training that stalls or runs away) cannot hide there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workbench.measure.result import TrialResult

EARLY_STEPS = 3
#: Allowed relative loss deviation over the first steps, by the least precise dtype of the pair.
#: bf16 at 5%: a correct change (inductor's bf16 kernels against eager bf16, bev-perception tiny, 2
#: AdamW updates) deviated 3.77% on an Intel host with AMX, under 3% on an AMD one without it.
EARLY_RTOL = {"fp32": 0.005, "fp16": 0.02, "bf16": 0.05}
#: Allowed relative difference of the mean loss over the last quarter of the steps, by the least
#: precise dtype of the pair. A tuner's 13-step window leaves a 3-step tail, whose mean still moves
#: with each batch: correct changes on bev-perception tiny (seeds 0-3) differed up to 4.2% in fp32
#: (channels_last) but up to 20.8% with bf16, which made 20% reject bf16, this CPU's best lever. Broken
#: training is far outside 30%: a stalled run (lr 1e-7) differed 52-113%, a runaway one (lr 0.1) 58% and
#: more, on bev-perception and e2e-planner.
TREND_RTOL = {"fp32": 0.2, "fp16": 0.2, "bf16": 0.3}
_PRECISION_ORDER = ("fp32", "fp16", "bf16")


@dataclass
class NumericsCheck:
    ok: bool | None
    """None when the two trials saw different data (seed or samples per step differ)."""
    early_deviation: float | None
    """Max relative loss deviation over the first EARLY_STEPS steps."""
    early_tolerance: float | None
    trend_deviation: float | None
    """Relative difference of the mean loss over the last quarter of the steps."""
    trend_tolerance: float
    note: str


def _least_precise(baseline_amp: str, candidate_amp: str) -> str:
    return _PRECISION_ORDER[max(_PRECISION_ORDER.index(baseline_amp), _PRECISION_ORDER.index(candidate_amp))]


def early_tolerance(baseline_amp: str, candidate_amp: str) -> float:
    return EARLY_RTOL[_least_precise(baseline_amp, candidate_amp)]


def trend_tolerance(baseline_amp: str, candidate_amp: str) -> float:
    return TREND_RTOL[_least_precise(baseline_amp, candidate_amp)]


def relative_deviation(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """Max over shared steps of |candidate - baseline| / max(|baseline|, 1e-8); inf when either is non-finite."""
    n = min(len(baseline), len(candidate))
    if n == 0:
        return math.inf
    b, c = np.asarray(baseline[:n], dtype=float), np.asarray(candidate[:n], dtype=float)
    if not (np.isfinite(b).all() and np.isfinite(c).all()):
        return math.inf
    return float(np.max(np.abs(c - b) / np.maximum(np.abs(b), 1e-8)))


def trend_deviation(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    n = min(len(baseline), len(candidate))
    if n == 0:
        return math.inf
    tail = max(1, n // 4)
    b, c = np.asarray(baseline[n - tail : n], dtype=float), np.asarray(candidate[n - tail : n], dtype=float)
    if not (np.isfinite(b).all() and np.isfinite(c).all()):
        return math.inf
    return float(abs(c.mean() - b.mean()) / max(abs(b.mean()), 1e-8))


def check_numerics(baseline: TrialResult, candidate: TrialResult) -> NumericsCheck:
    amps = baseline.config.get("amp", "fp32"), candidate.config.get("amp", "fp32")
    band = trend_tolerance(*amps)
    if candidate.status == "diverged":
        return NumericsCheck(False, None, None, None, band, f"diverged at step {candidate.diverged_step}")
    if not baseline.losses or not candidate.losses:
        return NumericsCheck(None, None, None, None, band, "no losses to compare")
    if baseline.config.get("seed") != candidate.config.get("seed"):
        return NumericsCheck(None, None, None, None, band, "different seeds: the trials saw different data")
    if baseline.samples_per_step != candidate.samples_per_step:
        return NumericsCheck(None, None, None, None, band, "different samples per step: different batches")
    tol = early_tolerance(*amps)
    early = relative_deviation(baseline.losses[:EARLY_STEPS], candidate.losses[:EARLY_STEPS])
    trend = trend_deviation(baseline.losses, candidate.losses)
    ok = early <= tol and trend <= band
    if ok:
        note = "matches the baseline"
    elif early > tol:
        note = f"first {EARLY_STEPS} losses deviate {early:.2%} (tolerance {tol:.1%} for this dtype)"
    else:
        note = f"late loss level differs {trend:.1%} from the baseline (tolerance {band:.0%} for this dtype)"
    return NumericsCheck(ok, early, tol, trend, band, note)
