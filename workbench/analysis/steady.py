"""The steady step time of a long run from its stored rows, and a watched run held against a reference.

A watched job's history is stored as buckets of consecutive steps (one step each while
the run is short). The steady figure is the median over the buckets after the warm-up,
each weighted by its step count, of the bucket's mean step time: exactly the median step
time while buckets hold one step, a robust block figure once they hold more.

A watched run is one process, so a check of one against another has one unit a side;
its interval (a bootstrap over blocks of consecutive buckets) sees noise *within* the two
jobs, not between processes, which on a shared machine can move a job's median by
10-20%. Pick the threshold with that in mind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from workbench.analysis.regress import RegressionRow

#: Blocks of consecutive buckets resampled by the bootstrap (neighbouring steps are correlated).
BLOCKS = 20
RESAMPLES = 2000


class StepRowLike(Protocol):
    """A stored step row (`workbench.store.watched.StepRow`): read-only attributes suffice."""

    @property
    def first_step(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def step_ms(self) -> float | None: ...


def steady_rows(rows: Sequence[StepRowLike], warmup: int) -> list[StepRowLike]:
    """Rows that start after the warm-up steps and have a step time."""
    return [r for r in rows if r.first_step > warmup and r.step_ms is not None and r.steps > 0]


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    order = np.argsort(values)
    v, w = np.asarray(values, float)[order], np.asarray(weights, float)[order]
    cumulative = np.cumsum(w) - 0.5 * w
    return float(np.interp(q * w.sum(), cumulative, v))


def steady_step_ms(rows: Sequence[StepRowLike], warmup: int) -> tuple[float | None, float | None]:
    """(median, interquartile range) of the steady step time in ms; (None, None) before any steady step."""
    kept = steady_rows(rows, warmup)
    if not kept:
        return None, None
    values, weights = [float(r.step_ms) for r in kept], [r.steps for r in kept]  # type: ignore[arg-type]
    median = weighted_quantile(values, weights, 0.5)
    return median, weighted_quantile(values, weights, 0.75) - weighted_quantile(values, weights, 0.25)


def check_watched(
    name: str,
    current: Sequence[StepRowLike],
    current_warmup: int,
    reference: Sequence[StepRowLike],
    reference_warmup: int,
    *,
    reference_label: str,
    threshold: float,
    confidence: float = 0.95,
    seed: int = 0,
) -> RegressionRow:
    """A watched run's steady step time against a reference run's, gated like `check_one`: a regression
    when the whole interval of the time change lies beyond `threshold`."""
    now, ref = steady_rows(current, current_warmup), steady_rows(reference, reference_warmup)
    row = RegressionRow(name, "watched run", "pass", [], reference_label, units=1)
    row.current_median_ms = steady_step_ms(current, current_warmup)[0]
    if not ref:
        row.status = "no baseline"
        row.notes.append(f"{reference_label} has no step after its {reference_warmup} warm-up step(s)")
        return row
    if not now:
        row.status = "failed"
        row.reasons.append(f"the watched run has no step after its {current_warmup} warm-up step(s)")
        return row
    row.reference_median_ms = steady_step_ms(reference, reference_warmup)[0]
    assert row.current_median_ms is not None and row.reference_median_ms is not None
    row.time_change = row.current_median_ms / row.reference_median_ms - 1.0
    rng = np.random.default_rng(seed)
    ratios = [_block_median(now, rng) / _block_median(ref, rng) - 1.0 for _ in range(RESAMPLES)]
    tail = (1.0 - confidence) / 2.0
    low, high = (float(x) for x in np.quantile(ratios, [tail, 1.0 - tail]))
    row.time_change_ci = (low, high)
    row.speedup = 1.0 / (1.0 + row.time_change)
    row.half_width = (high - low) / 2.0
    row.verdict = "slower" if low > 0 else "faster" if high < 0 else "no significant difference"
    row.notes.append("one job a side: the interval sees noise within the two jobs, not between processes")
    if low > threshold:
        row.status = "regression"
        row.reasons.append(f"slower by {row.time_change:+.1%} (interval {low:+.1%}..{high:+.1%} > {threshold:+.1%})")
    return row


def _block_median(rows: Sequence[StepRowLike], rng: np.random.Generator) -> float:
    """The weighted median of one bootstrap resample of blocks of consecutive rows."""
    blocks = np.array_split(np.arange(len(rows)), min(BLOCKS, len(rows)))
    chosen = rng.integers(0, len(blocks), len(blocks))
    picked = [rows[i] for b in chosen for i in blocks[b]]
    return weighted_quantile([float(r.step_ms) for r in picked], [r.steps for r in picked], 0.5)  # type: ignore[arg-type]
