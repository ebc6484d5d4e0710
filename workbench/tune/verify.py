"""More measurement for contenders: successive halving over the calibrated protocol's rounds.

Screening ranks configurations by one process each, which moves ±10–20% on a busy host;
contenders therefore go through `run_protocol` against the baseline (paired rounds, adaptive
to a precision). A rung keeps the better half by the objective's speedup; the last rung is
the verification, and its winner is `pick_winner`'s — the same rule as every comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.compare import CandidateComparison, pick_winner
from workbench.config import TrainConfig
from workbench.measure.result import TrialResult
from workbench.protocol import ComparisonRun, Protocol, run_protocol
from workbench.tune.objective import Objective, objective_row

MAX_CONTENDERS = 4
"""Configurations the first rung takes from screening; each rung halves them, down to two."""


@dataclass
class Rung:
    """One protocol comparison of the search: who went in, and the rows in the objective's units."""

    name: str
    configs: list[TrainConfig]
    outcome: ComparisonRun
    rows: list[CandidateComparison]
    winner: int | None = None
    tied: list[int] = field(default_factory=list)
    interrupted: bool = False
    """Cancelled before its rounds ended: its rows are partial and decide nothing."""

    def to_dict(self) -> dict[str, Any]:
        comp = self.outcome.comparison
        return {
            "name": self.name,
            "interrupted": self.interrupted,
            "design": comp.design,
            "rounds": comp.rounds,
            "stop_reason": comp.stop_reason,
            "elapsed_s": comp.elapsed_s,
            "candidates": [row_dict(c, r) for c, r in zip(self.configs, self.rows)],
        }


def row_dict(config: TrainConfig, row: CandidateComparison) -> dict[str, Any]:
    return {
        "config": config.to_dict(),
        "describe": config.describe(),
        "speedup": row.speedup,
        "speedup_ci": list(row.speedup_ci) if row.speedup_ci else None,
        "verdict": row.verdict,
        "units": row.units,
        "numerics_ok": row.numerics.ok,
        "median_step_ms": row.summary.median_step_ms,
        "peak_memory_bytes": row.summary.peak_memory_bytes,
        "break_even_steps": row.break_even_steps,
    }


def measure_rung(
    name: str,
    workload: Any,
    baseline: TrainConfig,
    baseline_result: TrialResult,
    configs: Sequence[TrainConfig],
    protocol: Protocol,
    objective: Objective,
    save: Callable[[TrialResult, str], None],
    **window: Any,
) -> Rung:
    """One `run_protocol` of `configs` against the baseline; its fresh trials saved to the tune run."""
    outcome = run_protocol(workload, baseline, list(configs), protocol, store=None, known_baseline=[baseline_result],
                           labels=["baseline", *(c.describe() for c in configs)], **window)  # fmt: skip
    comp = outcome.comparison
    rows = [objective_row(r, comp.baseline, objective, margin=protocol.margin, precision=protocol.precision)
            for r in comp.candidates]  # fmt: skip
    for config, runs, row in zip(configs, outcome.candidate_runs, rows):
        for result in runs:
            result.comparison = {"role": "candidate", "stage": name, "speedup": row.speedup,
                                 "speedup_ci": row.speedup_ci, "verdict": row.verdict, "units": row.units,
                                 "design": comp.design, "rounds": comp.rounds}  # fmt: skip
            save(result, f"{name}: {config.describe()}")
    for result in outcome.baseline_runs[1:]:  # the processes design's later baseline units
        save(result, f"{name}: baseline")
    winner, tied = pick_winner(rows)
    return Rung(name, list(configs), outcome, rows, winner, tied)


def survivors(rung: Rung, keep: int) -> list[TrainConfig]:
    """The better half: ranked by the objective's speedup, failures and slower ones out."""
    ranked = sorted(
        (i for i, r in enumerate(rung.rows) if r.speedup is not None and r.verdict not in ("failed", "slower")
         and r.numerics.ok is not False),
        key=lambda i: -(rung.rows[i].speedup or 0.0),
    )  # fmt: skip
    return [rung.configs[i] for i in ranked[:keep]]


def rung_budget(remaining_s: float, rungs_left: int) -> float:
    """The share of what is left that this rung may spend (the last rung takes the rest)."""
    return remaining_s if rungs_left <= 1 else remaining_s * 0.45


def with_budget(protocol: Protocol, budget_s: float) -> Protocol:
    return dataclasses.replace(protocol, budget_s=max(1.0, budget_s))
