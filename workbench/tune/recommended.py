"""The diagnosis's recommendations, measured first and verified, before the sampler proposes anything.

A tuner whose answer depends on the draw is worse than the one-line advice it started from. So
each setting the baseline's diagnosis recommends is screened (one trial, which also teaches the
sampler) and then, whatever that one noisy trial said, compared with the baseline by the
calibrated protocol, all of them in one rung; the ones the protocol finds faster are combined and
the combination screened. The best verified recommendation and the combination then always go to
the final verification, beside the sampler's best: the search can only add to the advice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.diagnose import diagnose
from workbench.config import ConfigError, TrainConfig
from workbench.levers import check_config
from workbench.measure import TrialResult
from workbench.tune.verify import Rung

#: Recommendations measured one at a time against the baseline (the biggest bottleneck's first).
MAX_RECOMMENDED = 3


@dataclass
class Recommended:
    """What the recommendations stage found: each single lever, the verified ones, their combination."""

    candidates: list[dict[str, Any]] = field(default_factory=list)
    """{finding, title, changes, config}: in the diagnosis's order."""
    rung: Rung | None = None
    helped: list[TrainConfig] = field(default_factory=list)
    """Verified faster than the baseline (sound numerics), fastest first."""
    combined: TrainConfig | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def forced(self) -> list[TrainConfig]:
        """What the final verification must include: the combination, then the best single lever."""
        return [c for c in (self.combined, *self.helped[:1]) if c is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": [{k: v for k, v in c.items() if k != "config"} for c in self.candidates],
            "rung": self.rung.to_dict() if self.rung is not None else None,
            "helped": [c.describe() for c in self.helped],
            "combined": self.combined.describe() if self.combined is not None else None,
            "notes": list(self.notes),
        }


def recommended_configs(
    baseline: TrainConfig, base: TrialResult, device: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """Baseline + each actionable recommendation of the baseline's diagnosis that this device runs."""
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        findings = diagnose(base).findings
    except Exception as exc:  # advice orders the start; the search works without it
        return [], [f"no diagnosis of the baseline: {type(exc).__name__}: {exc}"]
    for finding in findings:
        for advice in finding.recommendations:
            if not advice.actionable or len(out) >= MAX_RECOMMENDED:
                continue
            try:
                config = advice.apply(baseline, device)
            except ConfigError as exc:
                notes.append(f"recommendation '{advice.title}' not measured: {exc}")
                continue
            if config != baseline and all(c["config"] != config for c in out):
                out.append({"finding": finding.title, "title": advice.title, "changes": dict(advice.changes),
                            "config": config})  # fmt: skip
    return out, notes


def combine(baseline: TrainConfig, helped: list[TrainConfig], device: Any) -> TrainConfig | None:
    """All the verified levers at once (earlier ones win a conflict); None when fewer than two or invalid."""
    if len(helped) < 2:
        return None
    changes: dict[str, Any] = {}
    for config in reversed(helped):
        changes.update({name: new for name, (_, new) in baseline.diff(config).items()})
    try:
        combined = baseline.replace(**changes)
        check_config(combined, device)
    except ConfigError:
        return None
    return combined if combined not in helped else None


def verified_faster(rung: Rung) -> list[TrainConfig]:
    """The rung's configurations the protocol found faster with sound numerics, fastest first."""
    rows = [(c, r) for c, r in zip(rung.configs, rung.rows)
            if r.verdict == "faster" and r.numerics.ok is not False]  # fmt: skip
    return [c for c, _ in sorted(rows, key=lambda cr: -(cr[1].speedup or 0.0))]
