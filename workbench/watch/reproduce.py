"""From a watched job to a measured A/B: "reproduce in the workbench".

A watched job is the user's own loop, which the workbench cannot re-run by itself; given the
same model and data as a `Workload` (or the name of a built-in one), it can. The job's own
configuration is the baseline when it is a `TrainConfig` (as `wb.watch(config=...)` stored it);
a profiled trial of it is diagnosed, each recommendation that changes a setting becomes a
candidate, and the calibrated protocol compares them. The verified winner exports as any
comparison's does (`wb.export(result.winner_config, "snippet")`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.diagnose import Diagnosis, diagnose_trial
from workbench.config import ConfigError, TrainConfig, field_names
from workbench.measure.profile import ProfileOptions
from workbench.protocol import ComparisonRun, Protocol, run_protocol
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.store.watched import WatchedRun, watched_runs
from workbench.terminal import comparison_table
from workbench.trials import run_trial
from workbench.workloads import Workload

#: The baseline's profiled window: enough for the diagnosis's shares, short (it is before the A/B).
DIAGNOSIS_PROFILE = ProfileOptions(wait=0, warmup=1, active=2, record_shapes=False, memory_timeline=False)


@dataclass
class Reproduction:
    """The watched job's baseline, its diagnosis, the candidates it led to and their comparison."""

    job: str
    baseline: TrainConfig
    diagnosis: Diagnosis
    candidates: list[TrainConfig]
    titles: list[str]
    """Each candidate's recommendation, in the same order."""
    run: ComparisonRun | None
    notes: list[str] = field(default_factory=list)

    @property
    def winner_config(self) -> TrainConfig:
        """The verified winner (the baseline when no candidate is significantly faster)."""
        winner = self.run.comparison.winner if self.run is not None else None
        return self.baseline if winner is None else self.candidates[winner]

    def describe(self) -> str:
        lines = [f"reproduced '{self.job}' in the workbench; baseline: {self.baseline.describe()}"]
        lines += [f"  candidate {i + 1}: {title}" for i, title in enumerate(self.titles)]
        lines += [f"note: {note}" for note in self.notes]
        if self.run is not None:
            lines += ["", comparison_table(self.run), f"verified winner: {self.winner_config.describe()}"]
        return "\n".join(lines)


def reproduce(
    job: str,
    workload: Workload | str | None = None,
    *,
    baseline: TrainConfig | None = None,
    store: StoreArg = DEFAULT_STORE,
    protocol: Protocol | None = None,
    max_candidates: int | None = None,
    **trial_options: Any,
) -> Reproduction:
    """Measure the watched job `job`'s recommended levers against its own configuration.

    `workload`: the job's model and data as a Workload, a built-in name or a 'module:attr' spec;
    None uses the job's configuration's `workload` entry when it names one. Trial options
    (steps, warmup, device, preset, ...) are `TrialRequest`'s; the comparison is saved to `store`.
    `max_candidates`: measure only the first N recommendations (the biggest bottleneck's first)."""
    if max_candidates is not None and (isinstance(max_candidates, bool) or not isinstance(max_candidates, int)
                                       or max_candidates < 1):  # fmt: skip
        raise ConfigError(f"max_candidates must be a whole number >= 1 (or None for all), got {max_candidates!r}")
    run = _newest(job, store)
    workload = workload if workload is not None else run.config.get("workload")
    if workload is None:
        raise ConfigError(
            f"the watched job '{job}' is your own loop, which the workbench cannot re-run alone: pass its model "
            "and data as workload= (a wb.Workload, a built-in name or 'package.module:attr')"
        )
    notes: list[str] = []
    if baseline is None:
        baseline, why = _baseline_of(run)
        if why:
            notes.append(why)
    profiled = run_trial(workload, baseline, profile=DIAGNOSIS_PROFILE, **trial_options)
    if not profiled.ok:
        raise ConfigError(f"the baseline trial of '{job}' did not run ({profiled.status}): {profiled.message}")
    diagnosis = diagnose_trial(profiled, workload if not isinstance(workload, str) else None)
    candidates: list[TrainConfig] = []
    titles: list[str] = []
    for finding in diagnosis.findings:
        for advice in finding.recommendations:
            if not advice.actionable:
                continue
            try:
                candidate = advice.apply(baseline, trial_options.get("device"))
            except ConfigError as exc:
                notes.append(f"not measured, '{advice.title}': {exc}")
                continue
            if candidate != baseline and candidate not in candidates and len(candidates) < (max_candidates or 1 << 30):
                candidates.append(candidate)
                titles.append(f"{advice.title} ({finding.title})")
    if not candidates:
        notes.append("the diagnosis recommends no setting to change: nothing to compare")
        return Reproduction(job, baseline, diagnosis, [], [], None, notes)
    comparison = run_protocol(workload, baseline, candidates, protocol, store=store, run_label=f"reproduce {job}",
                              labels=["baseline", *titles], **trial_options)  # fmt: skip
    return Reproduction(job, baseline, diagnosis, candidates, titles, comparison, notes)


def _newest(job: str, store: StoreArg) -> WatchedRun:
    with opened_store(store, create=False) as db:
        runs = watched_runs(db, name=job, limit=1) if db is not None else []
    if not runs:
        raise ConfigError(f"no watched job named '{job}' in the run history (`workbench history` lists them)")
    return runs[0]


def _baseline_of(run: WatchedRun) -> tuple[TrainConfig, str]:
    """The job's configuration as a TrainConfig when it is one; else the defaults, saying so."""
    fields = {k: v for k, v in run.config.items() if k in field_names()}
    others = sorted(set(run.config) - set(fields) - {"workload"})
    try:
        config = TrainConfig.from_dict(fields)
    except (ConfigError, TypeError, ValueError) as exc:
        return (
            TrainConfig(),
            f"the job's configuration is not a valid TrainConfig ({exc}); the baseline is the defaults",
        )
    why = f"not TrainConfig fields, left out of the baseline: {', '.join(others)}" if others else ""
    return config, why
