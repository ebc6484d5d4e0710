"""`tune()`: the fastest configuration that fits, within a time budget, verified by the protocol.

Order of work: the baseline (profiled, so it can be diagnosed), the diagnosis's recommendations
measured first and verified by the protocol (`recommended.py`; the ones that help combined), the
largest batch the memory limit allows (estimate, then one verifying trial), screening by Optuna
(seeded: the same inputs give the same proposals) until its share of the budget is spent, then
successive halving of the contenders over `run_protocol` rounds, the last rung being the
verification against the baseline; the best verified recommendation and the combination always
reach it.
Every trial is saved to one "tune" run as it ends, which is what `resume=True` continues.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from workbench.config import ConfigError, TrainConfig
from workbench.measure import TrialResult
from workbench.measure.profile import ProfileOptions
from workbench.protocol import Protocol
from workbench.store import DEFAULT_STORE, StoreArg
from workbench.trials import run_trial
from workbench.tune import record as rec
from workbench.tune.loader_settle import LOADER_FIELDS, settled_by_trial
from workbench.tune.objective import DEFAULT_PLANNED_STEPS, Objective, choose_kind, cost_ms, judge
from workbench.tune.recommended import Recommended, combine, recommended_configs, verified_faster
from workbench.tune.result import TuneResult
from workbench.tune.screening import Screening, TunedTrial, distributions_of, make_pruner, make_sampler, study_trial
from workbench.tune.space import SearchSpace, check_space, default_space, user_space
from workbench.tune.study import SharedStudy
from workbench.tune.verify import MAX_CONTENDERS, measure_rung, rung_budget, survivors, with_budget
from workbench.workloads import Workload, load_workload

MIN_BUDGET_S = 20.0
"""Below this not even the baseline, one screening trial and the protocol's minimum rounds fit."""
SCREEN_SHARE = 0.55
"""Share of the budget for screening; the rest buys protocol rounds for the contenders."""
BASELINE_SHARE = 0.25
"""A baseline trial that takes more than this share of the budget leaves no room for a search."""
RECOMMEND_SHARE = 0.4
"""Share of the budget the protocol may spend verifying the diagnosis's recommendations."""
RECOMMEND_MIN_BUDGET_S = 60.0
"""Below this budget a protocol rung for the recommendations would starve the final verification:
they are only queued first for screening (one trial each), as the sampler's first proposals."""
RECOMMEND_COMPILE_SHARE = 0.05
"""A recommendation whose screening trial compiled for longer than this share of the budget stays
out of the recommendations rung (every paired worker of the protocol would compile it again); it
competes as a screening contender instead."""

SEED_PROFILE = ProfileOptions(wait=0, warmup=1, active=1, record_shapes=False, scan_syncs=False, memory_timeline=False)
"""The baseline's profiled window, after its timed one: enough for the diagnosis's shares, kept
short because it is spent from the search's budget."""

Update = Callable[[dict[str, Any]], None]


def tune(
    workload: Workload | str,
    *,
    budget_s: float = 600.0,
    baseline: TrainConfig | None = None,
    space: SearchSpace | Mapping[str, Any] | None = None,
    objective: str | None = None,
    planned_steps: int = DEFAULT_PLANNED_STEPS,
    max_memory_bytes: int | None = None,
    global_batch: int | None = None,
    protocol: Protocol | None = None,
    warmup: int = 3,
    steps: int = 10,
    device: Any = None,
    preset: str = "tiny",
    store: StoreArg = DEFAULT_STORE,
    resume: bool = False,
    seed: int = 0,
    seed_from_diagnosis: bool = True,
    cancel: threading.Event | None = None,
    on_update: Update | None = None,
    storage: str | None = None,
    study: str | None = None,
    **trial_options: Any,
) -> TuneResult:
    """Search `space` (default: every lever this device can run) for the configuration with the
    best `objective`, and verify it against `baseline` with the comparison protocol.

    `space`: a SearchSpace, or a dict of field -> list of values (the whole space; fields not
    named stay at the baseline's values). `objective`: 'throughput' (per sample; the default
    when batch sizes vary) or 'step-time'. `global_batch` keeps batch_size × grad_accumulation
    fixed. Input errors raise ConfigError before any trial; a trial's crash never ends the search.

    `storage` (a postgresql:// URL) and `study` (a name): join the study that every process given
    the same two shares, on this machine or others (`study.py`): each measures the sampler's next
    proposal on its own device, the baseline and the verification run once, and the verdict is kept
    in the study. `resume` then means: the study must exist already."""
    began = time.monotonic()
    cancel = cancel or threading.Event()
    baseline = baseline or TrainConfig()
    wl = load_workload(workload, preset=preset, **baseline.extra) if isinstance(workload, str) else workload
    workload_batch = wl.effective_batch_size(baseline)
    if not budget_s >= MIN_BUDGET_S:
        raise ConfigError(
            f"a budget of {budget_s:g} s is too small for even one round (the baseline, one screening trial and "
            f"the protocol's {Protocol().rounds_floor} rounds); give at least {MIN_BUDGET_S:g} s, e.g. --budget 5m"
        )
    space = _space(space, device, workload_batch, global_batch)
    samples_vary = global_batch is None and any(n in space.searched for n in ("batch_size", "grad_accumulation"))
    goal = Objective(choose_kind(objective, samples_vary), planned_steps, max_memory_bytes)
    valid = check_space(space, baseline, device)
    if max_memory_bytes is not None:
        _check_memory_floor(wl, max_memory_bytes)
    protocol = protocol or Protocol()
    window = dict(warmup=warmup, steps=steps, device=device, preset=preset, **trial_options)
    identity = _identity(workload, wl, preset, device, window, space, goal, baseline, seed)
    if storage is None and study is not None:
        raise ConfigError("--study names a shared study: give its --storage postgresql://... too")
    shared = _shared_study(storage, study, identity, space, resume, seed) if storage is not None else None
    record = rec.TuneRecord(store, identity, resume=resume and shared is None)
    try:
        search = _Search(wl, baseline, space, goal, protocol, window, record, cancel, on_update or (lambda u: None))
        search.shared = shared
        return search.run(began, budget_s, valid, seed=seed, seed_from_diagnosis=seed_from_diagnosis)
    finally:
        try:
            record.close()
        finally:
            if shared is not None:
                shared.close()


class _Search:
    """The state of one search session: trials so far, the study, the clock."""

    def __init__(self, workload: Workload, baseline: TrainConfig, space: SearchSpace, goal: Objective,
                 protocol: Protocol, window: dict[str, Any], record: rec.TuneRecord, cancel: threading.Event,
                 emit: Update) -> None:  # fmt: skip
        self.workload, self.baseline, self.space, self.goal = workload, baseline, space, goal
        self.protocol, self.window, self.record, self.cancel, self.emit = protocol, window, record, cancel, emit
        self.durations: list[float] = []
        self.notes: list[str] = []
        self.estimates: dict[str, int | None] = {}
        self.shared: SharedStudy | None = None

    def run(
        self, began: float, budget_s: float, valid: int | None, *, seed: int, seed_from_diagnosis: bool
    ) -> TuneResult:
        self.began, self.budget_s = began, budget_s
        result = TuneResult(workload=self.workload.name, preset=self.window["preset"], objective=self.goal,
                            space=self.space, valid_configs=valid, budget_s=budget_s, run_id=None, seed=seed)  # fmt: skip
        base = self._baseline(seed_from_diagnosis and not self.record.previous)
        result.baseline = base
        if not base.ok:
            result.stop_reason = "cancelled" if self.cancel.is_set() else (
                f"the baseline failed ({base.status}): {base.message.strip().splitlines()[0][:200]}")  # fmt: skip
            return self._finish(result)
        if self.durations and self.durations[0] > BASELINE_SHARE * budget_s:
            raise ConfigError(
                f"a budget of {budget_s:g} s is too small for even one round: the baseline trial alone took "
                f"{self.durations[0]:.0f} s; give at least {self.durations[0] / BASELINE_SHARE:.0f} s"
            )
        screening = Screening(
            self.space,
            self.baseline,
            base,
            self.goal,
            self._measure,
            self._estimator(),
            seed=seed,
            samples_of=self._samples,
            device=self.window["device"],
            user_cancel=self.cancel,
            shared=self.shared,
        )
        result.screening = screening
        if self.shared is not None:  # the shared study holds the baseline's trial; no diagnosis seeds
            return self._run_shared(screening, base, result, valid)
        screening.replay(base, rec.BASELINE, resumed=bool(self.record.previous))
        for label, stored in self.record.previous:
            if label in (rec.SCREEN, rec.VERIFY_BATCH) and screening.replay(stored, label) is not None:
                result.resumed_trials += 1
        if not self.record.previous:
            if seed_from_diagnosis and budget_s >= RECOMMEND_MIN_BUDGET_S:
                result.recommended = self._recommended(screening, base, result)
                result.seeds = [{k: c[k] for k in ("finding", "title", "changes")}
                                for c in result.recommended.candidates]  # fmt: skip
            elif seed_from_diagnosis:
                result.seeds = self._queued(screening, base)
            result.largest_batch = self._largest_batch(screening)
        self._screen(screening, valid)
        result.stop_reason = "cancelled" if self.cancel.is_set() else ""
        if not self.cancel.is_set():
            self._verify(screening, base, result)
        return self._finish(result)

    # --- stages -----------------------------------------------------------------------------

    def _run_shared(self, screening: Screening, base: TrialResult, result: TuneResult, valid: int | None) -> TuneResult:
        """A process of a shared study: screen until its share of the budget or the verification
        starts, then the verification (if no other process has it) or the study's verdict."""
        assert self.shared is not None
        result.shared_study = self.shared.name
        self._screen(screening, valid)
        result.stop_reason = "cancelled" if self.cancel.is_set() else ""
        if not self.cancel.is_set():
            with self.shared.only_one("verification"):
                verdict = self.shared.attr("verdict")
                if verdict is None:
                    self.shared.study.set_user_attr("verifying", True)  # the others stop screening
                    self.shared.wait_until_idle(max(0.0, self.budget_s - (time.monotonic() - self.began)))
                    screening.adopt_shared()
                    self._verify(screening, base, result)
                    verdict = {
                        "best": result.best(),
                        "stop_reason": result.stop_reason,
                        "rungs": [r.to_dict() for r in result.rungs],
                        "run_id": self.record.run_id,
                    }
                    self.shared.set_verdict(json.loads(json.dumps(verdict, default=str)))
            result.study_verdict = verdict
            result.stop_reason = result.stop_reason or verdict["stop_reason"]
        return self._finish(result)

    def _baseline(self, profiled: bool) -> TrialResult:
        stored = [r for label, r in self.record.previous if label == rec.BASELINE and r.ok]
        if stored:
            return stored[0]
        if self.shared is not None:
            result, measured = self.shared.baseline(lambda: self._shared_baseline(profiled))
            if not measured:
                return result
        else:
            result = self._measure(self.baseline, None, self.cancel, profile=SEED_PROFILE if profiled else False)
        self.record.save(result, rec.BASELINE)
        self.emit({"event": "baseline", "trial": {"config": result.config, "status": result.status,
                   "median_step_ms": result.median_step_ms, "peak_memory_bytes": result.peak_memory_bytes}})  # fmt: skip
        return result

    def _shared_baseline(self, profiled: bool) -> TrialResult:
        """Measured by the first process of a shared study, and added to it as its first trial (so no
        process measures the baseline's configuration again as a proposal)."""
        assert self.shared is not None
        result = self._measure(self.baseline, None, self.cancel, profile=SEED_PROFILE if profiled else False)
        params = self.space.params_of(self.baseline)
        if result.ok and params is not None:
            outcome = judge(result, result, self.goal)
            self.shared.study.add_trial(study_trial(self.shared.optuna, distributions_of(self.space), params, outcome))
        return result

    def _queued(self, screening: Screening, base: TrialResult) -> list[dict[str, Any]]:
        """A small budget's recommendations: the sampler's first proposals, screened like any other."""
        resolved = self.baseline.replace(batch_size=self.workload.effective_batch_size(self.baseline))
        candidates, notes = recommended_configs(resolved, base, self.window["device"])
        self.notes += notes
        seeds = []
        for candidate in candidates:
            changes = dict(candidate["changes"])
            if "batch_size" in screening.distributions:  # the baseline's own batch, not the sampler's draw
                changes.setdefault("batch_size", resolved.batch_size)
            if screening.enqueue(changes):
                seeds.append({k: candidate[k] for k in ("finding", "title", "changes")})
        return seeds

    def _recommended(self, screening: Screening, base: TrialResult, result: TuneResult) -> Recommended:
        """Each recommended lever screened, then all of them against the baseline in one protocol rung
        (never dropped on one noisy trial); the verified ones combined and the combination screened."""
        found = Recommended()
        # The baseline with its unset batch resolved (None: the workload's own), so a recommendation is
        # the baseline plus its one change and a point of the space, not a draw of the batch size.
        resolved = self.baseline.replace(batch_size=self.workload.effective_batch_size(self.baseline))
        candidates, found.notes = recommended_configs(resolved, base, self.window["device"])
        for candidate in candidates:  # a space given explicitly is the whole space: advice outside it waits
            if self.space.params_of(candidate["config"]) is None:
                found.notes.append(f"recommendation '{candidate['title']}' is outside the search space: not measured")
            else:
                found.candidates.append(candidate)
        ran = []
        for candidate in found.candidates:
            if self.cancel.is_set():
                return found
            trial = screening.run_config(candidate["config"], rec.SCREEN)
            self._saved(trial)
            if trial.status == "ok" and (trial.compile_time_s or 0.0) > RECOMMEND_COMPILE_SHARE * self.budget_s:
                # Most likely a cold compile cache, which this first trial has now filled: the rung's workers
                # load from it. Judge by a second, warm trial, or the same search would take a different path
                # on a fresh machine than on a used one.
                trial = screening.run_config(candidate["config"], rec.SCREEN, fresh=True)
                self._saved(trial)
            if trial.status != "ok":
                continue
            if (trial.compile_time_s or 0.0) > RECOMMEND_COMPILE_SHARE * self.budget_s:
                found.notes.append(f"'{candidate['title']}' compiled for {trial.compile_time_s:.0f} s: too long to "
                                   "verify in the recommendations rung at this budget; it competes as a screened contender")  # fmt: skip
                continue
            ran.append(candidate["config"])
        if not ran:
            return found
        screened = {t_key: t for t_key, t in screening.known.items() if t.feasible}
        fitted = self._fit(ran, base, screened, RECOMMEND_SHARE * self.budget_s)
        if len(fitted) < len(ran):
            found.notes.append(f"{len(ran) - len(fitted)} recommendation(s) left out of the protocol: the budget's "
                               f"{RECOMMEND_SHARE:.0%} share did not fit them")  # fmt: skip
        if not fitted or self.cancel.is_set():
            return found
        found.rung = measure_rung("recommendations", self.workload, self.baseline, base, fitted,
                                  with_budget(self.protocol, RECOMMEND_SHARE * self.budget_s), self.goal,
                                  self.record.save, cancel=self.cancel, **self.window)  # fmt: skip
        found.rung.interrupted = self.cancel.is_set()
        result.rungs.append(found.rung)
        self.emit({"event": "rung", "rung": found.rung.to_dict(), **self._clock()})
        if found.rung.interrupted:
            return found
        found.helped = verified_faster(found.rung)
        combined = combine(self.baseline, found.helped, self.window["device"])
        if combined is not None:
            trial = screening.run_config(combined, rec.SCREEN)
            self._saved(trial)
            found.combined = combined if trial.status == "ok" else None
        return found

    def _largest_batch(self, screening: Screening) -> dict[str, Any] | None:
        """The largest batch the memory limit allows by the estimate, then one trial to verify it."""
        limit = self.goal.max_memory_bytes
        sizes = self.space.values.get("batch_size", ())
        if limit is None or len(sizes) < 2 or self.space.global_batch is not None:
            return None
        from workbench.estimate import max_batch_size

        try:
            found = max_batch_size(self.workload, self.baseline, self._device_name(), memory_budget=limit,
                                   preset=self.window["preset"], limit=4 * max(sizes))  # fmt: skip
        except Exception as exc:  # the estimate is a shortcut; without it the trials still decide
            self.notes.append(f"largest batch not estimated: {type(exc).__name__}: {exc}")
            return None
        info: dict[str, Any] = {"estimated": found.max_batch_size, "estimated_peak_bytes": found.estimate.peak_bytes
                                if found.estimate else None}  # fmt: skip
        if found.max_batch_size < 1:
            info["note"] = "not even batch 1 fits the limit by the estimate"
            return info
        config = self.baseline.replace(batch_size=found.max_batch_size)
        trial = screening.run_config(config, rec.VERIFY_BATCH)
        self._saved(trial)
        info.update(verified_batch=found.max_batch_size, status=trial.status, reason=trial.reason,
                    peak_memory_bytes=trial.peak_memory_bytes)  # fmt: skip
        return info

    def _screen(self, screening: Screening, valid: int | None) -> None:
        deadline = self.began + SCREEN_SHARE * self.budget_s
        while not self.cancel.is_set() and not screening.exhausted:
            if valid is not None and len(screening.in_space) >= valid:
                break
            if self.shared is not None and self.shared.attr("verifying"):
                break
            typical = float(np.median(self.durations)) if self.durations else 0.0
            if time.monotonic() + typical > deadline:
                break
            trial = screening.step()
            if trial is not None:
                self._saved(trial)
                self._settle_loader_by_trial(screening, trial)

    def _verify(self, screening: Screening, base: TrialResult, result: TuneResult) -> None:
        base_key = self.baseline.to_json(sort_keys=True)
        feasible = sorted((t for t in screening.trials if t.feasible and TrainConfig.from_dict(t.config).to_json(
            sort_keys=True) != base_key), key=lambda t: t.cost_ms or 0.0)  # fmt: skip
        if not feasible:
            result.stop_reason = "no configuration other than the baseline ran within the limits"
            return
        result.screened_best = feasible[0]
        steps = {TrainConfig.from_dict(t.config).to_json(sort_keys=True): t for t in feasible}
        # The verified recommendations first (the final rung always holds them), then screening's ranking.
        forced = [
            c for c in (result.recommended.forced if result.recommended else []) if c.to_json(sort_keys=True) in steps
        ]
        ranked = [TrainConfig.from_dict(t.config) for t in feasible]
        unique = {c.to_json(sort_keys=True): c for c in reversed([*forced, *ranked])}  # first occurrence wins
        contenders = sorted(unique.values(), key=[*forced, *ranked].index)[:MAX_CONTENDERS]
        rungs_left = 2 if len(contenders) > 2 else 1
        while contenders and not self.cancel.is_set():
            remaining = self.budget_s - (time.monotonic() - self.began)
            budget = rung_budget(remaining, rungs_left)
            fitted = self._fit(contenders, base, steps, budget)
            if rungs_left > 1 and len(fitted) <= 2:  # no room for halving: straight to the verification
                rungs_left, budget = 1, remaining
                fitted = self._fit(contenders[:2], base, steps, budget)
            if not fitted:
                result.stop_reason = (
                    f"the budget ran out before the protocol could verify a contender ({remaining:.0f} s left); "
                    "the screening ranking is unverified: give a larger --budget"
                )
                return
            name = "verification" if rungs_left == 1 else f"rung {len(result.rungs) + 1}"
            rung = measure_rung(name, self.workload, self.baseline, base, fitted,
                                with_budget(self.protocol, budget), self.goal, self.record.save,
                                cancel=self.cancel, **self.window)  # fmt: skip
            rung.interrupted = self.cancel.is_set()  # its rows are partial: they prove nothing
            result.rungs.append(rung)
            self.emit({"event": "rung", "rung": rung.to_dict(), **self._clock()})
            if rung.interrupted:
                result.stop_reason = "cancelled"
                return
            rungs_left -= 1
            if rungs_left == 0:
                break
            contenders = survivors(rung, keep=2)
        if not result.rungs:
            return
        result.stop_reason = result.stop_reason or (
            "verified" if result.rungs[-1].winner is not None else "no configuration is significantly better than the baseline")  # fmt: skip

    def _fit(self, contenders: list[TrainConfig], base: TrialResult, screened: dict[str, TunedTrial],
             budget_s: float) -> list[TrainConfig]:  # fmt: skip
        """The contenders whose protocol floor (a fresh trial each, then the minimum rounds) fits
        `budget_s`, dropping the slowest-ranked first: the protocol always measures its floor, so a
        rung that cannot afford it would overrun the search's budget."""
        from workbench.protocol import paired_refusal

        fitted = list(contenders)
        trial_s = float(np.median(self.durations)) if self.durations else 0.0
        floor = self.protocol.rounds_floor
        while fitted:
            steps_s = [(base.median_step_ms or 0.0) / 1000.0]
            steps_s += [(screened[c.to_json(sort_keys=True)].median_step_ms or 0.0) / 1000.0 for c in fitted]
            if paired_refusal([self.baseline, *fitted]) is None:
                blocks = [self.protocol.block_for(s * 1000.0) for s in steps_s]
                block_s = sum((count + switch) * s for (count, switch), s in zip(blocks, steps_s))
                rounds_s = floor * block_s + trial_s  # + the paired worker
            else:
                rounds_s = floor * (len(fitted) + 1) * trial_s
            if len(fitted) * trial_s + rounds_s <= budget_s:
                return fitted
            fitted.pop()
        return []

    def _settle_loader_by_trial(self, screening: Screening, trial: TunedTrial) -> None:
        """Pin the loader once a feasible trial waits for data no longer than the noise."""
        if trial.result is None or not trial.feasible or any(n in screening.pinned for n in LOADER_FIELDS):
            return
        settled = settled_by_trial(trial.result, screening.distributions, self.protocol.precision)
        if settled:
            screening.pin(settled)
            shown = ", ".join(f"{k}={v}" for k, v in settled.items())
            self.notes.append(
                f"loader levers settled at {shown}: trial {trial.number} waited for data no more than "
                f"{self.protocol.precision:.0%} of its step, so later proposals search the other levers"
            )

    # --- helpers ---------------------------------------------------------------------------

    def _measure(
        self, config: TrainConfig, on_event: Any, cancel: threading.Event, *, profile: Any = False, **extra: Any
    ) -> TrialResult:
        started = time.monotonic()
        options = {**self.window, **extra}
        result = run_trial(self.workload, config, on_event=on_event, cancel=cancel, profile=profile, **options)
        self.durations.append(time.monotonic() - started)
        return result

    def _saved(self, trial: TunedTrial) -> None:
        if trial.result is not None and not trial.resumed:
            self.record.save(trial.result, trial.stage)
        self.emit({"event": "trial", "trial": trial.to_dict(), **self._clock()})

    def _clock(self) -> dict[str, float]:
        return {"elapsed_s": time.monotonic() - self.began, "budget_s": self.budget_s}

    def _samples(self, config: TrainConfig) -> int:
        return self.workload.effective_batch_size(config) * config.grad_accumulation

    def _device_name(self) -> str:
        from workbench.device import device_info, resolve_device

        dev = resolve_device(self.window["device"])
        return "cpu" if dev.type == "cpu" else device_info(dev).name

    def _estimator(self) -> Callable[[TrainConfig], int | None] | None:
        if self.goal.max_memory_bytes is None:
            return None
        from workbench.estimate import estimate_memory

        def estimate(config: TrainConfig) -> int | None:
            key = config.to_json(sort_keys=True)
            if key not in self.estimates:
                try:
                    self.estimates[key] = estimate_memory(self.workload, config, self._device_name(),
                                                          preset=self.window["preset"]).peak_bytes  # fmt: skip
                except Exception:  # the estimate is a shortcut; a config it cannot fake still gets a trial
                    self.estimates[key] = None
            return self.estimates[key]

        return estimate

    def _finish(self, result: TuneResult) -> TuneResult:
        result.run_id = self.record.run_id
        result.budget_used_s = time.monotonic() - self.began
        result.notes += self.notes
        if result.baseline is not None and result.baseline.ok:
            result.baseline_cost_ms = cost_ms(result.baseline, self.goal)
        self.emit({"event": "done", "result": result.to_dict()})
        return result


# --- input checks -------------------------------------------------------------------------


def _space(space: Any, device: Any, workload_batch: int, global_batch: int | None) -> SearchSpace:
    if global_batch is not None and (isinstance(global_batch, bool) or not isinstance(global_batch, int)
                                     or global_batch < 1):  # fmt: skip
        raise ConfigError(f"global batch must be a whole number >= 1, got {global_batch!r}")
    if space is None:
        return default_space(workload_batch, device, global_batch=global_batch)
    if isinstance(space, SearchSpace):
        return space
    made = user_space(space, device, workload_batch=workload_batch, global_batch=global_batch)
    if global_batch is not None:
        if "grad_accumulation" in made.values:
            raise ConfigError(
                "grad_accumulation follows the batch size when the global batch is fixed; drop it from the space"
            )
        sizes = tuple(s for s in made.values.get("batch_size", (global_batch,)) if global_batch % s == 0)
        if not sizes:
            raise ConfigError(f"no batch_size in the space divides the global batch {global_batch}")
        made = dataclasses.replace(made, values={**made.values, "batch_size": sizes})
    return made


def _check_memory_floor(workload: Workload, max_memory_bytes: int) -> None:
    """A limit below the parameters alone can fit no configuration: say so before any trial."""
    from workbench.textfmt import format_bytes

    model = workload.model_fn()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    if max_memory_bytes < params:
        raise ConfigError(
            f"max memory {format_bytes(max_memory_bytes)} is below the model's parameters alone "
            f"({format_bytes(params)}); training needs roughly 4x that (parameters, gradients, optimizer state, "
            "activations): raise --max-memory or choose a smaller preset"
        )


def _shared_study(
    storage: str, name: str | None, identity: dict[str, Any], space: SearchSpace, resume: bool, seed: int
) -> SharedStudy:
    """Join (or start) the shared study. The question must match; the device must be the same kind
    (its name, from the device facts); each process samples with its own seed (one seed in every
    process would propose one sequence to all of them)."""
    from workbench.device import device_info, resolve_device

    dev = resolve_device(identity["device"])
    kind = f"{dev.type}: {device_info(dev).name}"
    question = {k: v for k, v in identity.items() if k not in ("device", "seed")}
    own_seed = seed * 1_000_003 + uuid.uuid4().int % 1_000_000
    sampler = make_sampler(space, own_seed, shared=True)
    return SharedStudy(storage, name or "", question, kind, resume=resume, sampler=sampler, pruner=make_pruner())


def _identity(workload: Any, wl: Workload, preset: str, device: Any, window: dict[str, Any], space: SearchSpace,
              goal: Objective, baseline: TrainConfig, seed: int) -> dict[str, Any]:  # fmt: skip
    """What a resumed search must share with the stored one. The sampler's seed is part of it: it is
    recorded with the run, and another seed proposes another sequence, so it is another search."""
    from workbench.device import resolve_device

    return {
        "workload": workload if isinstance(workload, str) else wl.name,
        "preset": preset,
        "device": str(resolve_device(device)),
        "warmup": window["warmup"],
        "steps": window["steps"],
        "space": space.key(),
        "objective": goal.kind,
        "planned_steps": goal.planned_steps,
        "max_memory_bytes": goal.max_memory_bytes,
        "baseline": baseline.to_json(sort_keys=True),
        "seed": seed,
    }
