"""`TuneResult`: what a search found, as plain data for the CLI's `--json`, the app and tests.

`best` is the verification rung's winner by `pick_winner` (or, when nothing beat the
baseline significantly, its fastest contender marked `winner: false`); `runner_ups` are the
ones it is not significantly better than; `pareto` the non-dominated screening trials on
(objective cost, peak memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config import TrainConfig
from workbench.measure.result import TrialResult
from workbench.tune.objective import Objective, pareto_front
from workbench.tune.space import SearchSpace

if TYPE_CHECKING:
    from workbench.tune.recommended import Recommended
    from workbench.tune.screening import Screening, TunedTrial
    from workbench.tune.verify import Rung


@dataclass
class TuneResult:
    workload: str
    preset: str
    objective: Objective
    space: SearchSpace
    valid_configs: int | None
    budget_s: float
    run_id: int | None
    baseline: TrialResult | None = None
    baseline_cost_ms: float | None = None
    screening: Screening | None = None
    rungs: list[Rung] = field(default_factory=list)
    seeds: list[dict[str, Any]] = field(default_factory=list)
    largest_batch: dict[str, Any] | None = None
    screened_best: TunedTrial | None = None
    """The best configuration by screening alone (one process each: unverified)."""
    resumed_trials: int = 0
    budget_used_s: float = 0.0
    stop_reason: str = ""
    notes: list[str] = field(default_factory=list)
    seed: int = 0
    """The sampler's seed: the same inputs and seed give the same sequence of proposals."""
    recommended: Recommended | None = None
    """The diagnosis's recommendations, measured first: one protocol rung, the verified ones combined."""
    shared_study: str | None = None
    """The shared study's name, when this process searched as one of several (`study.py`)."""
    study_verdict: dict[str, Any] | None = None
    """A shared study's verdict ('best', 'stop_reason', 'rungs'), as the one process that verified stored it."""

    @property
    def tied(self) -> bool:
        """The top is a tie: the best is not significantly better than the runner-ups (within noise)."""
        return bool(self.runner_ups())

    @property
    def trials(self) -> list[TunedTrial]:
        return list(self.screening.trials) if self.screening is not None else []

    @property
    def best_config(self) -> TrainConfig | None:
        best = self.best()
        return TrainConfig.from_dict(best["config"]) if best else None

    def best(self) -> dict[str, Any] | None:
        """The verified winner (`winner: True`), else the fastest contender of the last rung that
        finished (a rung interrupted by a cancel decides nothing)."""
        from workbench.tune.verify import row_dict

        final = self._last_complete_rung()
        if final is None:  # a process of a shared study that another process verified for
            return dict(self.study_verdict["best"]) if self.study_verdict and self.study_verdict["best"] else None
        index = final.winner
        is_winner = index is not None
        if index is None:
            ranked = [i for i, r in enumerate(final.rows) if r.speedup is not None]
            if not ranked:
                return None
            index = max(ranked, key=lambda i: final.rows[i].speedup or 0.0)
        return {**row_dict(final.configs[index], final.rows[index]), "winner": is_winner}

    def runner_ups(self) -> list[dict[str, Any]]:
        from workbench.tune.verify import row_dict

        final = self._last_complete_rung()
        if final is None:
            return []
        return [row_dict(final.configs[i], final.rows[i]) for i in final.tied]

    def _last_complete_rung(self) -> Rung | None:
        return next((rung for rung in reversed(self.rungs) if not rung.interrupted), None)

    def pareto(self) -> list[TunedTrial]:
        measured = [t for t in self.trials if t.feasible and t.peak_memory_bytes is not None]
        front = pareto_front([(t.cost_ms or 0.0, t.peak_memory_bytes or 0) for t in measured])
        return [measured[i] for i in front]

    def export(self, fmt: str, **kwargs: Any) -> str:
        """The best configuration as a snippet, JSON or command (`workbench.export`)."""
        from workbench.config import ConfigError
        from workbench.export import export_config

        config = self.best_config
        if config is None:
            raise ConfigError("the search found no configuration to export (see its stop reason)")
        if fmt == "command":
            kwargs = {"workload": self.workload, "preset": self.preset, **kwargs}
        return export_config(config, fmt, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        if best is not None:
            config = TrainConfig.from_dict(best["config"])
            best["export"] = {"json": config.to_dict(), "command": _command(config, self.workload, self.preset)}
        base = self.baseline
        return {
            "workload": self.workload,
            "preset": self.preset,
            "objective": {
                "kind": self.objective.kind,
                "unit": self.objective.unit,
                "planned_steps": self.objective.planned_steps,
                "max_memory_bytes": self.objective.max_memory_bytes,
            },
            "space": {
                **self.space.to_dict(),
                "valid_configs": self.valid_configs,
                "refused_combinations": len(self.screening.refused) if self.screening else 0,
            },
            "baseline": None
            if base is None
            else {
                "config": base.config,
                "status": base.status,
                "median_step_ms": base.median_step_ms,
                "peak_memory_bytes": base.peak_memory_bytes,
                "cost_ms": self.baseline_cost_ms,
                "trial_id": base.trial_id,
            },
            "best": best,
            "runner_ups": self.runner_ups(),
            "screened_best": self.screened_best.to_dict() if self.screened_best else None,
            "trials": [t.to_dict() for t in self.trials],
            "pareto": [t.to_dict() for t in self.pareto()],
            "rungs": [r.to_dict() for r in self.rungs],
            "seeds": self.seeds,
            "seed": self.seed,
            "sampler": f"optuna TPESampler(seed={self.seed})"
            if self.shared_study is None
            else f"optuna TPESampler(constant_liar, a seed per process) on the shared study '{self.shared_study}'",
            "shared_study": self.shared_study,
            "tied": self.tied,
            "recommended": self.recommended.to_dict() if self.recommended is not None else None,
            "largest_batch": self.largest_batch,
            "resumed_trials": self.resumed_trials,
            "budget_s": self.budget_s,
            "budget_used_s": self.budget_used_s,
            "stop_reason": self.stop_reason,
            "run_id": self.run_id,
            "notes": self.notes,
            "study_verdict": self.study_verdict,
        }


def _command(config: TrainConfig, workload: str, preset: str) -> str | None:
    from workbench.config import ConfigError
    from workbench.export import to_command

    try:
        return to_command(config, workload=workload, preset=preset)
    except ConfigError:
        return None
