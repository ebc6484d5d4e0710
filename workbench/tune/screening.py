"""Cheap screening: one fresh trial per configuration, chosen by Optuna's TPE sampler.

TPE models categorical spaces directly; its percentile pruner ends a trial whose running
cost is in the slowest quarter of the trials so far at the same step. A configuration is
measured at most once: a repeat proposal is answered from the first measurement, a failure
is never retried, and a combination `TrainConfig` refuses is never run nor counted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.config import ConfigError, TrainConfig
from workbench.measure import StepMeasured, TrialResult
from workbench.tune.objective import Objective, Outcome, judge, memory_refusal
from workbench.tune.space import SearchSpace

if TYPE_CHECKING:
    from workbench.tune.study import SharedStudy

PRUNE_PERCENTILE = 75.0
"""Keep trials whose running cost is within the best 75% at the same step; prune the rest."""
PRUNE_STARTUP_TRIALS = 5
PRUNE_WARMUP_STEPS = 3
PRUNED_WHY = "its running cost was in the slowest quarter of the trials so far at the same step"
MAX_REPEATS = 40
"""Proposals in a row that repeat a measured (or refused) configuration before the space counts
as exhausted."""


@dataclass
class TunedTrial:
    """One configuration the search looked at, and what became of it."""

    number: int
    config: dict[str, Any]
    params: dict[str, Any]
    stage: str
    status: str
    reason: str = ""
    cost_ms: float | None = None
    median_step_ms: float | None = None
    peak_memory_bytes: int | None = None
    estimated_peak_bytes: int | None = None
    samples_per_step: int | None = None
    compile_time_s: float | None = None
    trial_id: str | None = None
    wall_time_s: float | None = None
    resumed: bool = False
    """Measured by an earlier session of this search (read back from the store)."""
    result: TrialResult | None = field(default=None, repr=False)

    @property
    def feasible(self) -> bool:
        return self.status == "ok" and self.cost_ms is not None

    def to_dict(self) -> dict[str, Any]:
        keys = ("number", "config", "params", "stage", "status", "reason", "cost_ms", "median_step_ms",
                "peak_memory_bytes", "estimated_peak_bytes", "samples_per_step", "compile_time_s", "trial_id",
                "wall_time_s", "resumed")  # fmt: skip
        return {key: getattr(self, key) for key in keys}


class Screening:
    """The Optuna study over `space`, asked and told one configuration at a time."""

    def __init__(
        self,
        space: SearchSpace,
        baseline: TrainConfig,
        baseline_result: TrialResult,
        objective: Objective,
        measure: Callable[[TrainConfig, Any, threading.Event], TrialResult],
        estimate: Callable[[TrainConfig], int | None] | None = None,
        *,
        seed: int = 0,
        samples_of: Callable[[TrainConfig], int] = lambda c: 1,
        device: Any = None,
        user_cancel: threading.Event | None = None,
        shared: SharedStudy | None = None,
    ) -> None:
        try:
            import optuna
        except ImportError:  # optional at the edge: the rest of the workbench runs without it
            raise ConfigError("the tuner needs Optuna: pip install optuna") from None
        optuna.logging.set_verbosity(logging.WARNING)
        self.optuna = optuna
        self.space, self.baseline, self.baseline_result, self.objective = space, baseline, baseline_result, objective
        self.measure, self.estimate, self.samples_of = measure, estimate, samples_of
        self.device, self.user_cancel = device, user_cancel or threading.Event()
        self.distributions: dict[str, Any] = distributions_of(space)
        self.shared = shared
        """A study shared with other processes (`study.py`), else this process's own in memory."""
        if shared is not None:
            self.study = shared.study
        else:
            self.study = optuna.create_study(
                direction="minimize", sampler=make_sampler(space, seed), pruner=make_pruner()
            )
        self.trials: list[TunedTrial] = []
        self.known: dict[str, TunedTrial] = {}
        self.refused: dict[str, str] = {}
        self.in_space: set[str] = set()
        """Configurations of the space already looked at (the largest batch's check may lie outside it)."""
        self.repeats = 0
        self.pinned: dict[str, Any] = {}
        """Searched fields no longer searched: their value for every later proposal (`pin`)."""

    def pin(self, values: dict[str, Any]) -> None:
        """Stop searching these fields: later proposals take these values (the loader, once settled)."""
        self.pinned.update({name: value for name, value in values.items() if name in self.distributions})

    # --- what earlier sessions measured, and where to start ----------------------------------

    def replay(self, result: TrialResult, stage: str, *, resumed: bool = True) -> TunedTrial | None:
        """Feed a trial measured outside `step` into the study: a stored one (resume), the baseline."""
        if result.status == "cancelled" and not result.message.startswith("pruned"):
            return None  # stopped by the user, not finished: measured again when proposed
        config = TrainConfig.from_dict(result.config)
        params = self.space.params_of(config)
        if params is None or _key(config) in self.known:
            return None
        outcome = judge(result, self.baseline_result, self.objective)
        trial = self._record(config, params, stage, outcome, result, resumed=resumed)
        self.study.add_trial(study_trial(self.optuna, self.distributions, params, outcome))
        return trial

    def enqueue(self, changes: dict[str, Any]) -> bool:
        """Try `baseline + changes` early (a diagnosis recommendation); False when outside the space."""
        fixed = {n: v[0] for n, v in self.space.values.items() if n not in self.distributions}
        for name, value in changes.items():
            if name not in self.distributions and fixed.get(name, getattr(self.baseline, name, None)) != value:
                return False  # the advice changes a field this search keeps fixed
        params = {}
        for name, values in self.distributions.items():
            value = changes.get(name, getattr(self.baseline, name))
            if value not in values.choices:
                if name in changes:
                    return False
                continue
            params[name] = value
        self.study.enqueue_trial(params, skip_if_exists=True)
        return True

    # --- one step of the search -------------------------------------------------------------

    def step(self, stage: str = "screen") -> TunedTrial | None:
        """Ask for a configuration and measure it; None when it was a repeat or refused (not counted)."""
        if self.shared is not None:
            self.shared.fail_stale()
        wanted = {n: d for n, d in self.distributions.items() if n not in self.pinned}
        trial, repeat_of = self.shared.ask(wanted) if self.shared else (self.study.ask(wanted), None)
        params = {**{n: v[0] for n, v in self.space.values.items()}, **trial.params, **self.pinned}
        try:
            config = self.space.config(self.baseline, params)
            from workbench.levers import check_config

            check_config(config, self.device)
        except ConfigError as exc:
            self.refused[_params_key(params)] = str(exc)
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            self.repeats += 1
            return None
        known = self.known.get(_key(config))
        if known is not None:  # never measure twice; never retry a failure blindly
            value = known.cost_ms if known.feasible else None
            self.study.tell(trial, value, state=_state(self.optuna, Outcome(known.status, value)))
            self.repeats += 1
            return None
        if repeat_of is not None:  # another process of the shared study has it
            trial.set_user_attr("repeat_of", repeat_of)
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            self.repeats += 1
            return None
        self.repeats = 0
        estimated = self.estimate(config) if self.estimate is not None else None
        refusal = memory_refusal(estimated, self.objective, estimated=True)
        if refusal:  # the estimate says it cannot fit: not worth a trial
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            return self._record(config, params, stage, Outcome("over-memory", None, refusal + " (not run)"), None,
                                estimated=estimated)  # fmt: skip
        on_event, cancel, pruned = self._pruning(trial, config)
        with self.shared.beating(trial) if self.shared is not None else contextlib.nullcontext():
            result = self.measure(config, on_event, cancel)
        if pruned:
            result.message = f"pruned after {pruned[0]} timed steps: {PRUNED_WHY}"
        outcome = judge(result, self.baseline_result, self.objective)
        if self.shared is not None:
            self.shared.tell(
                trial,
                outcome.cost_ms if outcome.feasible else None,
                _state(self.optuna, outcome),
                _figures(result, outcome),
                result,
            )
        else:
            self.study.tell(trial, outcome.cost_ms if outcome.feasible else None, state=_state(self.optuna, outcome))
        return self._record(config, params, stage, outcome, result, estimated=estimated)

    def run_config(self, config: TrainConfig, stage: str, *, fresh: bool = False) -> TunedTrial:
        """Measure one given configuration outside the sampler's choice (a recommendation, the largest
        batch's check). `fresh`: measure it again even if known; the new trial is the one it is judged by."""
        params = self.space.params_of(config) or {k: new for k, (_, new) in self.baseline.diff(config).items()}
        known = self.known.get(_key(config))
        if known is not None and not fresh:
            return known
        result = self.measure(config, None, threading.Event())
        outcome = judge(result, self.baseline_result, self.objective)
        trial = self._record(config, params, stage, outcome, result)
        searched = {n: params[n] for n in self.distributions if n in params}
        inside = all(v in self.distributions[n].choices for n, v in searched.items())
        if len(searched) == len(self.distributions) and inside:  # a point of the space: the sampler learns from it
            self.study.add_trial(self.optuna.trial.create_trial(
                params=searched, distributions=self.distributions,
                value=outcome.cost_ms if outcome.feasible else None, state=_state(self.optuna, outcome)))  # fmt: skip
        return trial

    def adopt_shared(self) -> int:
        """Take in the trials other processes of the shared study measured (for the verification's
        ranking); they are marked resumed, so this process never stores them again. How many."""
        if self.shared is None:
            return 0
        adopted = 0
        finished = (self.optuna.trial.TrialState.COMPLETE,)
        for other in self.study.get_trials(deepcopy=False, states=finished):
            figures = other.user_attrs.get("figures")
            if figures is None or "repeat_of" in other.user_attrs:
                continue
            params = {**{n: v[0] for n, v in self.space.values.items()}, **other.params}
            config = self.space.config(self.baseline, params)
            if _key(config) in self.known:
                continue
            outcome = Outcome(figures["status"], other.value, figures["reason"])
            trial = self._record(config, params, "screen", outcome, None, resumed=True)
            trial.median_step_ms, trial.peak_memory_bytes = figures["median_step_ms"], figures["peak_memory_bytes"]
            trial.samples_per_step, trial.wall_time_s = figures["samples_per_step"], figures["wall_time_s"]
            trial.trial_id = figures["trial_id"]
            adopted += 1
        return adopted

    @property
    def exhausted(self) -> bool:
        return self.repeats >= MAX_REPEATS

    # --- internals ----------------------------------------------------------------------------

    def _pruning(self, trial: Any, config: TrainConfig) -> tuple[Callable[[Any], None], threading.Event, list[int]]:
        """An event sink that reports the running cost to Optuna and cancels a trial it prunes
        (or the whole search's cancel asks for); `pruned` holds the step it was pruned at."""
        cancel = threading.Event()
        steps: list[float] = []
        pruned: list[int] = []
        per = self.samples_of(config) if self.objective.kind == "throughput" else 1

        def on_event(event: Any) -> None:
            if self.user_cancel.is_set():
                cancel.set()
            if not isinstance(event, StepMeasured) or not event.timed or cancel.is_set():
                return
            steps.append(event.step_ms / per)
            trial.report(float(np.median(steps)), len(steps))
            if trial.should_prune():
                pruned.append(len(steps))
                cancel.set()

        return on_event, cancel, pruned

    def _record(self, config: TrainConfig, params: dict[str, Any], stage: str, outcome: Outcome,
                result: TrialResult | None, *, resumed: bool = False, estimated: int | None = None) -> TunedTrial:  # fmt: skip
        trial = TunedTrial(
            number=len(self.trials),
            config=config.to_dict(),
            params={n: params[n] for n in params if n in self.space.searched or n not in self.space.values},
            stage=stage,
            status=outcome.status,
            reason=outcome.reason,
            cost_ms=outcome.cost_ms,
            estimated_peak_bytes=estimated,
            resumed=resumed,
            result=result,
        )
        if result is not None:
            trial.median_step_ms, trial.peak_memory_bytes = result.median_step_ms, result.peak_memory_bytes
            trial.samples_per_step, trial.compile_time_s = result.samples_per_step, result.compile_time_s
            trial.trial_id, trial.wall_time_s = result.trial_id, result.wall_time_s
        self.trials.append(trial)
        self.known[_key(config)] = trial
        if self.space.params_of(config) is not None:
            self.in_space.add(_key(config))
        return trial


def distributions_of(space: SearchSpace) -> dict[str, Any]:
    import optuna

    return {n: optuna.distributions.CategoricalDistribution(v) for n, v in space.searched.items()}


def make_sampler(space: SearchSpace, seed: int | None, *, shared: bool = False) -> Any:
    """TPE over the space's categorical fields. Shared by several processes, it treats the trials still
    running as if they had the worst value seen (constant liar), so it does not hand them out again."""
    import optuna

    startup = min(10, max(3, len(space.searched)))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=shared)


def make_pruner() -> Any:
    import optuna

    return optuna.pruners.PercentilePruner(
        PRUNE_PERCENTILE, n_startup_trials=PRUNE_STARTUP_TRIALS, n_warmup_steps=PRUNE_WARMUP_STEPS
    )


def study_trial(optuna: Any, distributions: dict[str, Any], params: dict[str, Any], outcome: Outcome) -> Any:
    """A trial measured outside `ask` (the baseline, a replayed one) as the study records it."""
    searched = {n: params[n] for n in distributions}
    return optuna.trial.create_trial(
        params=searched,
        distributions=distributions,
        value=outcome.cost_ms if outcome.feasible else None,
        state=_state(optuna, outcome),
    )


def _figures(result: TrialResult, outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "reason": outcome.reason,
        "median_step_ms": result.median_step_ms,
        "peak_memory_bytes": result.peak_memory_bytes,
        "samples_per_step": result.samples_per_step,
        "wall_time_s": result.wall_time_s,
        "trial_id": result.trial_id,
    }


def _state(optuna: Any, outcome: Outcome) -> Any:
    states = optuna.trial.TrialState
    if outcome.feasible and outcome.cost_ms is not None and math.isfinite(outcome.cost_ms):
        return states.COMPLETE
    return states.PRUNED if outcome.status == "pruned" else states.FAIL


def _key(config: TrainConfig) -> str:
    return config.to_json(sort_keys=True)


def _params_key(params: dict[str, Any]) -> str:
    import json

    return json.dumps(params, sort_keys=True, default=str)
