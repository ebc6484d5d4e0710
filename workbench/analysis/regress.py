"""Regression checks: a suite's configurations now, against stored reference runs, with compare's statistics.

The statistics are `compare_trials`' own (bootstrap interval of the speedup, equivalence
margin, numerics guard). This module adds only the gate on top: a configuration fails
when its slowdown's *whole* interval lies beyond `threshold`, when the numerics guard
says its losses no longer match the reference, or when it failed to run. A
non-significant difference, or a slowdown whose interval still reaches below the
threshold, passes: a CI gate that fails on noise gets switched off.

Also here: the suite file format. Pure functions over results; finding the stored
reference trials is `workbench.store.reference`'s job, measuring is `workbench.api`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from workbench.analysis.compare import compare_trials
from workbench.analysis.intervals import MIN_UNITS
from workbench.config import RESOLVED_TOGGLES, ConfigError, TrainConfig, resolved_settings
from workbench.measure.result import TrialResult

RowStatus = Literal["pass", "regression", "failed", "no baseline"]
_SUITE_KEYS = ("name", "workload", "preset", "steps", "warmup", "repeats", "configurations")
#: Environment fields whose change between reference and now is worth a note beside the verdict.
_NOTED_ENV = ("torch", "cuda", "python", "host")


class SuiteError(ConfigError):
    """A malformed suite file; the message names the file and the entry."""


@dataclass(frozen=True)
class SuiteConfig:
    name: str
    config: TrainConfig


@dataclass(frozen=True)
class Suite:
    """What a regression check measures: one workload, one window, named configurations."""

    name: str
    workload: str
    preset: str
    steps: int
    warmup: int
    repeats: int
    configurations: tuple[SuiteConfig, ...]


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite JSON file (format: README, example: examples/regress-suite.json)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise SuiteError(f"cannot read suite file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SuiteError(f"suite file {path} is not valid JSON: {exc}") from None
    return parse_suite(data, source=str(path))


def parse_suite(data: Any, source: str = "suite") -> Suite:
    if not isinstance(data, dict):
        raise SuiteError(f"{source}: a suite is a JSON object with keys {', '.join(_SUITE_KEYS)}")
    unknown = sorted(set(data) - set(_SUITE_KEYS))
    if unknown:
        raise SuiteError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_SUITE_KEYS)}")
    workload = data.get("workload")
    if not isinstance(workload, str) or not workload.strip():
        raise SuiteError(f"{source}: 'workload' must be a built-in name or 'package.module:function'")
    preset = data.get("preset", "tiny")
    if not isinstance(preset, str):
        raise SuiteError(f"{source}: 'preset' must be a string such as 'tiny'")
    numbers = {key: data.get(key, default) for key, default in (("steps", 20), ("warmup", 3), ("repeats", MIN_UNITS))}
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SuiteError(f"{source}: '{key}' must be an integer >= 1, got {value!r}")
    entries = data.get("configurations")
    if not isinstance(entries, list) or not entries:
        raise SuiteError(f"{source}: 'configurations' must be a non-empty list of {{'name', 'config'}} objects")
    configurations = tuple(_suite_config(entry, index, source) for index, entry in enumerate(entries))
    names = [c.name for c in configurations]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SuiteError(f"{source}: configuration names must be unique; repeated: {', '.join(duplicates)}")
    name = data.get("name", Path(source).stem)
    return Suite(str(name), workload, preset, numbers["steps"], numbers["warmup"], numbers["repeats"], configurations)


def _suite_config(entry: Any, index: int, source: str) -> SuiteConfig:
    where = f"{source}: configurations[{index}]"
    if not isinstance(entry, dict) or set(entry) - {"name", "config"} or not isinstance(entry.get("name"), str):
        raise SuiteError(f"{where} must be an object {{'name': str, 'config': 'k=v,...' or {{...}}}}")
    name, spec = entry["name"].strip(), entry.get("config", "")
    if not name:
        raise SuiteError(f"{where}: 'name' must not be empty")
    try:
        if isinstance(spec, str):
            config = TrainConfig().with_overrides(spec) if spec.strip() else TrainConfig()
        elif isinstance(spec, dict):
            config = TrainConfig.from_dict(spec)
        else:
            raise ConfigError("'config' must be an override string ('amp=bf16,channels_last=true') or an object")
    except ConfigError as exc:
        raise SuiteError(f"{where} ('{name}'): {exc}") from None
    return SuiteConfig(name, config)


# --- the check ------------------------------------------------------------------------


@dataclass
class Baseline:
    """The stored trials a configuration is checked against, with a label saying where they are from."""

    label: str
    runs: list[TrialResult]


@dataclass
class RegressionRow:
    name: str
    config_label: str
    status: RowStatus
    reasons: list[str]
    """Why the row failed (empty when it passed)."""
    reference: str
    reference_median_ms: float | None = None
    current_median_ms: float | None = None
    time_change: float | None = None
    """Current ÷ reference median step time − 1: +0.12 is 12% slower."""
    time_change_ci: tuple[float, float] | None = None
    """The speedup's bootstrap interval, as a time change."""
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    verdict: str = ""
    half_width: float | None = None
    """The interval's relative half-width; None when too few trials (a side) to have one."""
    units: int = 0
    """Trials behind the interval (the smaller side)."""
    numerics_ok: bool | None = None
    numerics_note: str = ""
    notes: list[str] = field(default_factory=list)
    """What else differs from the reference (torch version, host...), shown beside the verdict."""
    reference_trial_ids: list[str] = field(default_factory=list)
    current_trial_ids: list[str] = field(default_factory=list)


@dataclass
class RegressionReport:
    suite: str
    against: str
    threshold: float
    confidence: float
    rows: list[RegressionRow]

    @property
    def regressed(self) -> bool:
        return any(row.status in ("regression", "failed") for row in self.rows)

    @property
    def exit_code(self) -> int:
        """1 when any configuration regressed or failed; 0 otherwise (also with no baseline yet)."""
        return 1 if self.regressed else 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "regressed": self.regressed, "exit_code": self.exit_code}


def check_regressions(
    suite: Suite,
    current: Mapping[str, Sequence[TrialResult]],
    baselines: Mapping[str, Baseline | None],
    *,
    against: str,
    threshold: float = 0.05,
    confidence: float = 0.95,
) -> RegressionReport:
    """Check each suite configuration's current trials against its baseline (None: no baseline yet)."""
    if not 0 <= threshold < 10:
        raise ConfigError(f"threshold must be a fraction such as 0.05 (5%), got {threshold!r}")
    rows = [
        check_one(item.name, list(current[item.name]), baselines.get(item.name), threshold, confidence)
        for item in suite.configurations
    ]
    return RegressionReport(suite.name, against, threshold, confidence, rows)


def check_one(
    name: str, current: list[TrialResult], baseline: Baseline | None, threshold: float, confidence: float = 0.95
) -> RegressionRow:
    label = TrainConfig.from_dict(current[0].config).describe()
    ids = [r.trial_id for r in current]
    if baseline is None or not baseline.runs:
        failed = next((r for r in current if not r.ok), None)
        if failed is not None:
            return RegressionRow(name, label, "failed", [f"{failed.status}: {_first_line(failed.message)}"], "",
                                 current_trial_ids=ids)  # fmt: skip
        return RegressionRow(name, label, "no baseline", [], "", current_median_ms=_pooled_median(current),
                             current_trial_ids=ids)  # fmt: skip
    unlike = _resolved_difference(baseline.runs, current)
    if unlike:
        note = f"not compared with {baseline.label}: it ran with different resolved settings ({unlike})"
        return RegressionRow(name, label, "no baseline", [], "", current_median_ms=_pooled_median(current),
                             notes=[note], current_trial_ids=ids)  # fmt: skip
    row = compare_trials(baseline.runs, [current], confidence=confidence).candidates[0]
    result = RegressionRow(
        name, label, "pass", [], baseline.label,
        reference_median_ms=_pooled_median(baseline.runs), current_median_ms=row.summary.median_step_ms,
        speedup=row.speedup, speedup_ci=row.speedup_ci, verdict=row.verdict, numerics_ok=row.numerics.ok,
        half_width=row.half_width, units=row.units,
        numerics_note=row.numerics.note, notes=_environment_notes(baseline.runs[0], current[0]),
        reference_trial_ids=[r.trial_id for r in baseline.runs], current_trial_ids=ids,
    )  # fmt: skip
    if row.speedup is not None and row.speedup_ci is not None:
        result.time_change = 1.0 / row.speedup - 1.0
        result.time_change_ci = (1.0 / row.speedup_ci[1] - 1.0, 1.0 / row.speedup_ci[0] - 1.0)
    if row.verdict == "failed":
        result.status = "failed"
        result.reasons.append(f"{row.summary.status}: {_first_line(row.summary.message)}")
    elif row.verdict == "slower" and result.time_change_ci is not None and result.time_change_ci[0] > threshold:
        result.status = "regression"
        low, high = result.time_change_ci
        result.reasons.append(
            f"slower by {result.time_change:+.1%} (interval {low:+.1%}..{high:+.1%} > {threshold:+.1%})"
        )
    if row.verdict == "inconclusive":
        result.notes.append(
            f"inconclusive: {row.units} trial(s) a side; at least {MIN_UNITS} a side (reference and now) are needed "
            "to see between-process noise"
        )
    if row.numerics.ok is False:
        result.status = "regression" if result.status == "pass" else result.status
        result.reasons.append(f"numerics: {row.numerics.note}")
    return result


def format_report(report: RegressionReport) -> str:
    """The terminal table of a report (formatting only: every figure comes from `check_one`)."""
    from workbench.textfmt import format_ms, table

    rows = []
    for row in report.rows:
        change = ""
        if row.time_change is not None and row.time_change_ci is not None:
            change = f"{row.time_change:+.1%} [{row.time_change_ci[0]:+.1%}, {row.time_change_ci[1]:+.1%}]"
        numerics = {True: "ok", False: "MISMATCH", None: "n/a"}[row.numerics_ok]
        outcome = row.status.upper() if row.status in ("regression", "failed") else row.status
        rows.append([row.name, row.reference or "-", format_ms(row.reference_median_ms),
                     format_ms(row.current_median_ms), change, row.verdict or "-", numerics, outcome])  # fmt: skip
    headers = ["configuration", "reference", "ref ms", "now ms", f"time Δ [{report.confidence:.0%} CI]", "verdict",
               "numerics", "result"]  # fmt: skip
    lines = [table(headers, rows)]
    for row in report.rows:
        for text in row.reasons + row.notes:
            lines.append(f"  {row.name}: {text}")
    counts = {s: sum(r.status == s for r in report.rows) for s in ("pass", "regression", "failed", "no baseline")}
    lines.append(
        f"suite '{report.suite}' against {report.against}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + f". A row fails when its whole interval is beyond {report.threshold:+.1%}, its numerics mismatch, "
        "or it failed to run."
    )  # fmt: skip
    return "\n".join(lines)


def _pooled_median(runs: Sequence[TrialResult]) -> float | None:
    steps = [t for r in runs if r.ok for t in r.step_ms]
    return float(np.median(steps)) if steps else None


def _resolved_difference(reference: Sequence[TrialResult], current: Sequence[TrialResult]) -> str:
    """'' when both sides ran the same optimizer implementation and float32 precision flags.

    The store matches configurations by what was asked for; this checks what it resolved to
    (`optimizer_impl='default'` is PyTorch's choice, which a new PyTorch may change). Only
    trials that ran are compared: a failed one may have built nothing.
    """
    ref, cur = (next((r for r in side if r.ok), None) for side in (reference, current))
    if ref is None or cur is None:
        return ""
    before, now = resolved_settings(ref.applied), resolved_settings(cur.applied)
    changed = [k for k in RESOLVED_TOGGLES if before.get(k) != now.get(k)]
    return "; ".join(f"{k}: {before.get(k, 'not recorded')} -> {now.get(k, 'not recorded')}" for k in changed)


def _environment_notes(reference: TrialResult, current: TrialResult) -> list[str]:
    notes = []
    for key in _NOTED_ENV:
        before, now = reference.environment.get(key), current.environment.get(key)
        if before != now:
            notes.append(f"{key} differs from the reference: {before} -> {now}")
    return notes


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:120] if text.strip() else ""
