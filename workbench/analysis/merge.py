"""Several comparisons against one baseline, as one: what the app's table shows after candidates were
compared one at a time.

Each candidate's verdict stays its own protocol run's; only the winner is picked across runs, by
`pick_winner` without a head-to-head (the runs share no units, so candidates whose intervals
overlap tie).
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.analysis.compare import Comparison, pick_winner, summarize
from workbench.measure.result import TrialResult


def merge_comparisons(baseline: Sequence[TrialResult], comparisons: Sequence[Comparison]) -> Comparison | None:
    """The candidates of every comparison in `comparisons` (each run against `baseline`'s
    configuration), the baseline summarized over its trials, the settings of the latest comparison
    and the winner among them all; None without a baseline trial or a candidate."""
    rows = [row for comparison in comparisons for row in comparison.candidates]
    if not baseline or not rows:
        return None
    winner, tied = pick_winner(rows)
    last = comparisons[-1]
    return Comparison(summarize(baseline), rows, rounds=max(r.units for r in rows), confidence=last.confidence,
                      equivalence_margin=last.equivalence_margin, design=last.design,
                      paired_workers=last.paired_workers, precision=last.precision, noise=last.noise,
                      winner=winner, tied=tied)  # fmt: skip
