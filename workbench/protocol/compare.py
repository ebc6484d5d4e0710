"""`run_protocol`: characterize, run the rounds, compare; the verdicts attached to the stored trials."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from workbench.analysis.compare import Comparison, UnitLog, compare_units, summarize
from workbench.analysis.loader_bound import LoaderBound
from workbench.analysis.numerics import check_numerics
from workbench.config import ConfigError, TrainConfig
from workbench.measure import EventSink, TrialRequest, TrialResult
from workbench.measure.child import discard_spares
from workbench.measure.hostload import HostLoad
from workbench.measure.staged import IDEAL_BATCHES
from workbench.protocol.design import COMPARE_STEPS, Protocol, paired_refusal
from workbench.protocol.rounds import Rounds, resolved_requests, spare_workers
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.trials import run_request
from workbench.workloads import Workload

IDEAL_LABEL = "ideal loader"


@dataclass
class ComparisonRun:
    comparison: Comparison
    baseline_runs: list[TrialResult]
    candidate_runs: list[list[TrialResult]]
    """Each configuration's fresh-worker trials (the characterizing one, then process-design units)."""
    log: UnitLog | None = None
    """The units behind the comparison (step times and host load per round), for a caller that
    re-analyses them, e.g. the busy-host benchmark setting today's rule beside the old one."""
    ideal_runs: list[TrialResult] = field(default_factory=list)
    """The ideal loader's fresh-worker trials (`ideal_loader=True`; empty otherwise)."""

    @property
    def loader_bound(self) -> LoaderBound | None:
        """What the data pipeline costs the baseline's step, when the ideal loader was measured."""
        bounds = self.comparison.bounds
        return LoaderBound.from_row(self.comparison.baseline, bounds[0]) if bounds else None

    def to_dict(self) -> dict[str, Any]:
        """JSON: {'baseline': run, 'candidates': [run + comparison fields], 'rounds', 'design', 'noise', ...}."""
        comp = self.comparison
        candidates = []
        for runs, row in zip(self.candidate_runs, comp.candidates):
            item = runs[0].to_dict()
            item.update(
                status=row.summary.status,
                median_step_ms=row.summary.median_step_ms,
                speedup=row.speedup,
                speedup_ci=list(row.speedup_ci) if row.speedup_ci else None,
                verdict=row.verdict,
                units=row.units,
                half_width=row.half_width,
                between_unit_sd=row.between_unit_sd,
                rounds_needed=row.rounds_needed,
                numerics_ok=row.numerics.ok,
                numerics=asdict(row.numerics),
                peak_memory_delta_bytes=row.peak_memory_delta_bytes,
                final_loss_delta=row.final_loss_delta,
                break_even_steps=row.break_even_steps,
                config_diff={k: list(v) for k, v in row.config_diff.items()},
                repeat_trial_ids=row.summary.trial_ids,
                utilization_summary=row.summary.utilization,
                utilization_delta=row.utilization_delta,
                load_changed_rounds=row.load_changed_rounds,
                verdict_note=row.verdict_note,
                interval_confidence=row.interval_confidence,
            )
            candidates.append(item)
        baseline = self.baseline_runs[0].to_dict()
        baseline.update(median_step_ms=comp.baseline.median_step_ms, repeat_trial_ids=comp.baseline.trial_ids)
        baseline.update(utilization_summary=comp.baseline.utilization)
        return {
            "baseline": baseline,
            "candidates": candidates,
            "rounds": comp.rounds,
            "design": comp.design,
            "paired_workers": comp.paired_workers,
            "confidence": comp.confidence,
            "precision": comp.precision,
            "equivalence_margin": comp.equivalence_margin,
            "noise": asdict(comp.noise),
            "winner": comp.winner,
            "tied": comp.tied,
            "stop_reason": comp.stop_reason,
            "elapsed_s": comp.elapsed_s,
            "loader_bound": self.loader_bound.to_dict() if self.loader_bound is not None else None,
        }


def run_protocol(
    workload: Workload | str,
    baseline: TrainConfig,
    candidates: Sequence[TrainConfig],
    protocol: Protocol | None = None,
    *,
    on_event: EventSink | None = None,
    cancel: threading.Event | None = None,
    store: StoreArg = DEFAULT_STORE,
    kind: str = "compare",
    run_label: str = "",
    labels: Sequence[str] = (),
    known_baseline: Sequence[TrialResult] = (),
    request: TrialRequest | None = None,
    ideal_loader: bool = False,
    **trial_options: Any,
) -> ComparisonRun:
    """Characterize, then measure rounds until precise or out of budget, then compare.

    The trial options (warmup, steps, device, preset, timeout_s, ...) are `TrialRequest`'s, given
    as keywords (steps defaults to `COMPARE_STEPS`) or as one `request` whose config is ignored.
    `known_baseline`: the baseline's fresh trials from earlier (the app re-uses them; they must
    be of `baseline` with the same window). Every fresh trial is saved to `store` as it ends;
    the comparison's figures are attached to those trials when the comparison ends.
    `ideal_loader`: one more row, the baseline's step on batches staged on the device
    (`measure.staged`), measured in the same rounds: `ComparisonRun.loader_bound`."""
    protocol = protocol or Protocol()
    if not candidates and not ideal_loader:
        raise ConfigError("a comparison needs at least one candidate configuration")
    configs = [baseline, *candidates]
    names = list(labels) or ["baseline", *(f"candidate {i}" for i in range(1, len(configs)))]
    if ideal_loader:
        configs, names = [*configs, baseline], [*names[: len(configs)], IDEAL_LABEL]
    refusal = paired_refusal(configs)
    if protocol.design == "paired" and refusal is not None:
        raise ConfigError(f"design='paired' is not honest here: {refusal}; use design='processes' or 'auto'")
    design = "processes" if protocol.design == "processes" or refusal is not None else "paired"
    emit = on_event or (lambda event: None)
    requests = configured_requests(workload, configs, names, request, trial_options)
    if ideal_loader:
        requests[-1] = replace(requests[-1], staged_batches=IDEAL_BATCHES)
    began = time.monotonic()
    load = HostLoad().start()
    spares = len(configs) - bool(known_baseline) + (protocol.paired_workers if design == "paired" else 0)
    with opened_store(store) as history, spare_workers(requests[0], design, spares):
        recorder = history.recorder(kind, label=run_label) if history is not None else None

        def fresh(index: int) -> TrialResult:
            result = run_request(requests[index], on_event, cancel)
            if recorder is not None:
                recorder.save(result, label=names[index])
            return result

        runs: list[list[TrialResult]] = [list(known_baseline)] + [[] for _ in configs[1:]]
        for index in range(len(configs)):
            if not runs[index]:
                runs[index].append(fresh(index))
        rounds = Rounds(requests, runs, protocol, design, began, emit, cancel, fresh)
        log, stop_reason = rounds.run()
        design = rounds.design
        discard_spares()  # reaped before the host-load reading, so their start-up is not "other" work
        summaries = [summarize(r) for r in runs]
        numerics = [check_numerics(runs[0][0], r[0]) for r in runs[1:]]
        comparison = compare_units(
            summaries,
            numerics,
            log,
            paired=design == "paired",
            design=design,
            confidence=protocol.confidence,
            equivalence_margin=protocol.margin,
            precision=protocol.precision,
            host_other_cores=load.other_cores(),
            baseline_steps=runs[0][0].step_ms,
            paired_workers=rounds.workers,
            bound_rows=int(ideal_loader),
        )
        comparison.stop_reason = stop_reason
        comparison.elapsed_s = time.monotonic() - began
        if history is not None:
            _attach(history, comparison, runs)
    ideal_runs = runs.pop() if ideal_loader else []
    return ComparisonRun(comparison, runs[0], runs[1:], log, ideal_runs)


def configured_requests(
    workload: Workload | str,
    configs: Sequence[TrainConfig],
    names: Sequence[str],
    request: TrialRequest | None,
    options: dict[str, Any],
) -> list[TrialRequest]:
    """One resolved request per configuration, all of one window: the device settled and each config
    checked on it once, before anything is measured (a candidate this device cannot run is refused
    before the baseline's trial, not after it)."""
    if request is None:
        request = TrialRequest.of(workload, configs[0], **{"steps": COMPARE_STEPS, **options})
    elif options:
        raise ConfigError(f"give the trial options in `request` or as keywords, not both (got {', '.join(options)})")
    return resolved_requests(replace(request, workload=workload), configs, names)


def _attach(history: Any, comparison: Comparison, runs: list[list[TrialResult]]) -> None:
    """The verdicts onto the stored trials, so `history` shows them with the trial."""
    common = {"design": comparison.design, "paired_workers": comparison.paired_workers,
              "rounds": comparison.rounds, "precision": comparison.precision,
              "confidence": comparison.confidence, "noise": asdict(comparison.noise),
              "stop_reason": comparison.stop_reason}  # fmt: skip
    figures: list[dict[str, Any]] = [{"role": "baseline", **common}]
    for row in comparison.candidates:
        figures.append(
            {
                "role": "candidate",
                "speedup": row.speedup,
                "speedup_ci": row.speedup_ci,
                "verdict": row.verdict,
                "units": row.units,
                "half_width": row.half_width,
                "load_changed_rounds": row.load_changed_rounds,
                "verdict_note": row.verdict_note,
                "interval_confidence": row.interval_confidence,
                **common,
            }
        )
    for bound in comparison.bounds:
        figures[0]["loader_bound"] = LoaderBound.from_row(comparison.baseline, bound).to_dict()
        figures.append({"role": IDEAL_LABEL, "loader_bound": figures[0]["loader_bound"], **common})
    for config_runs, data in zip(runs, figures):
        for result in config_runs:
            result.comparison = data
            try:
                history.attach_comparison(result.trial_id, data)
            except KeyError:  # a known baseline from another store or none at all
                pass
