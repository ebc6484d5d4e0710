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

from workbench.config import ConfigError, TrainConfig
from workbench.measure.result import TrialResult
from workbench.store.records import config_key

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
    device: str = ""
    """The device the first trial at this commit ran on (its fingerprint's name)."""

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
        points.append(
            SeriesPoint(
                commit,
                commit_label(commit),
                runs[0].started_at,
                len(runs),
                median,
                q1,
                q3,
                [r.trial_id for r in runs],
                str(runs[0].environment.get("device_name") or runs[0].device.get("name") or ""),
            )
        )
    return points


def config_series(
    store: Store,
    workload: str,
    configs: Sequence[TrainConfig | dict[str, Any]] | None = None,
    *,
    environment: dict[str, Any] | str | None = None,
    preset: str | None = None,
) -> dict[str, list[SeriesPoint]]:
    """One series per configuration (by its label), for `configs` or every configuration stored for
    `workload`; a configuration with no 'ok' trial is left out."""
    if configs is None:
        trials = store.trials(workload=workload, preset=preset, environment=environment, ok_only=True)
        by_key: dict[str, TrainConfig | dict[str, Any]] = {}
        for trial in trials:
            by_key.setdefault(config_key(trial.result.config), trial.result.config)
        configs = list(by_key.values())
    series = {}
    for config in configs:
        points = step_time_series(store, workload, config, environment=environment, preset=preset)
        if points:
            series[_config_label(config)] = points
    return series


def _config_label(config: TrainConfig | dict[str, Any]) -> str:
    try:
        return (config if isinstance(config, TrainConfig) else TrainConfig.from_dict(config)).describe()
    except ConfigError:  # stored by a version with other fields: its own words still name it
        fields = config.to_dict() if isinstance(config, TrainConfig) else config
        return ", ".join(f"{k}={v}" for k, v in sorted(fields.items())) or "defaults"


def commit_label(commit: str | None) -> str:
    if not commit:
        return "no commit"
    bare = commit.removesuffix("+dirty")
    return bare[:10] + ("+dirty" if bare != commit else "")
