"""Step time across commits for one configuration: the plain data behind the History chart.

One point per commit, in the order commits were first measured (not commit-graph
order: the store does not know the graph, and "what was measured after what" is
what a regression hunt reads). A point pools the timed steps of every 'ok' trial at
that commit, the same pooling `compare_trials` applies to repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.config import TrainConfig
from workbench.measure.result import TrialResult

if TYPE_CHECKING:
    from workbench.store.core import Store


@dataclass
class SeriesPoint:
    commit: str | None
    """As fingerprinted: a sha, 'sha+dirty', or None outside git."""
    label: str
    """Short form for an axis: the first 10 hex digits, '+dirty' kept."""
    first_started_at: float
    trials: int
    median_step_ms: float
    q1_step_ms: float
    q3_step_ms: float
    trial_ids: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_time_series(
    store: Store,
    workload: str,
    config: TrainConfig | dict[str, Any],
    *,
    environment: dict[str, Any] | str | None = None,
    preset: str | None = None,
) -> list[SeriesPoint]:
    """The series for `config` on `workload` (and comparable hardware, when `environment` is given)."""
    trials = store.trials(workload=workload, preset=preset, config=config, environment=environment, ok_only=True)
    return series_from_results([t.result for t in trials])


def series_from_results(results: Sequence[TrialResult]) -> list[SeriesPoint]:
    """Group ok results by commit (first-measured order) and pool each group's timed steps."""
    groups: dict[str | None, list[TrialResult]] = {}
    for result in sorted((r for r in results if r.ok and r.step_ms), key=lambda r: r.started_at):
        groups.setdefault(result.environment.get("git_commit"), []).append(result)
    points = []
    for commit, runs in groups.items():
        steps = np.asarray([t for r in runs for t in r.step_ms], dtype=float)
        q1, median, q3 = (float(x) for x in np.percentile(steps, [25, 50, 75]))
        points.append(SeriesPoint(commit, commit_label(commit), runs[0].started_at, len(runs), median, q1, q3,
                                  [r.trial_id for r in runs]))  # fmt: skip
    return points


def commit_label(commit: str | None) -> str:
    if not commit:
        return "no commit"
    bare = commit.removesuffix("+dirty")
    return bare[:10] + ("+dirty" if bare != commit else "")
