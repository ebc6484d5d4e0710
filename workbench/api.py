"""The public API the CLI, the notebook app and the server share: run one trial, run a comparison.

Thin on purpose: trials come from `measure`, statistics from `analysis`; this module
only decides the order trials run in (interleaved repeats) and pairs the results up.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from workbench.analysis.compare import Comparison, compare_trials
from workbench.config import ConfigError, TrainConfig
from workbench.measure import EventSink, TrialResult, run_trial
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.workloads import Workload


@dataclass
class ComparisonRun:
    comparison: Comparison
    baseline_runs: list[TrialResult]
    candidate_runs: list[list[TrialResult]]

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {'baseline': run, 'candidates': [run + comparison fields], 'repeats': N}."""
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
                numerics_ok=row.numerics.ok,
                numerics=asdict(row.numerics),
                peak_memory_delta_bytes=row.peak_memory_delta_bytes,
                final_loss_delta=row.final_loss_delta,
                break_even_steps=row.break_even_steps,
                config_diff={k: list(v) for k, v in row.config_diff.items()},
                repeat_trial_ids=row.summary.trial_ids,
            )
            candidates.append(item)
        baseline = self.baseline_runs[0].to_dict()
        baseline.update(median_step_ms=comp.baseline.median_step_ms, repeat_trial_ids=comp.baseline.trial_ids)
        return {"baseline": baseline, "candidates": candidates, "repeats": comp.repeats, "confidence": comp.confidence}


def run_comparison(
    workload: Workload | str,
    baseline: TrainConfig,
    candidates: Sequence[TrainConfig],
    *,
    repeats: int = 1,
    warmup: int = 3,
    steps: int = 20,
    device: Any = None,
    preset: str = "tiny",
    on_event: EventSink | None = None,
    cancel: threading.Event | None = None,
    store: StoreArg = DEFAULT_STORE,
    **trial_options: Any,
) -> ComparisonRun:
    """Run baseline and candidates interleaved (B C1 C2 B C1 C2 ...) `repeats` times, then compare.

    Every finished trial is saved to `store` (default: the user's run history; None: not saved).
    """
    if not candidates:
        raise ConfigError("a comparison needs at least one candidate configuration")
    labels = ["baseline", *(f"candidate {i}" for i in range(1, len(candidates) + 1))]
    runs = run_trials(workload, [baseline, *candidates], repeats=repeats, labels=labels, kind="compare", store=store,
                      warmup=warmup, steps=steps, device=device, preset=preset, on_event=on_event, cancel=cancel,
                      **trial_options)  # fmt: skip
    comparison = compare_trials(runs[0], runs[1:])
    return ComparisonRun(comparison, runs[0], runs[1:])


def run_trials(
    workload: Workload | str,
    configs: Sequence[TrainConfig],
    *,
    repeats: int = 1,
    labels: Sequence[str] = (),
    kind: str = "run",
    run_label: str = "",
    store: StoreArg = DEFAULT_STORE,
    **trial_options: Any,
) -> list[list[TrialResult]]:
    """`run_trial` for each config, interleaved `repeats` times; runs[i] holds config i's repeats.

    Each trial is saved to `store` as one stored run's trial, right after it finished (so
    an interrupted comparison keeps the trials it completed, and never half of one).
    The store is opened before the first trial: a broken history file fails in a second,
    not after minutes of measuring.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")
    runs: list[list[TrialResult]] = [[] for _ in configs]
    with opened_store(store) as history:
        recorder = history.recorder(kind, label=run_label) if history is not None else None
        for _ in range(repeats):
            for index, config in enumerate(configs):
                result = run_trial(workload, config, **trial_options)
                if recorder is not None:
                    recorder.save(result, label=labels[index] if index < len(labels) else "")
                runs[index].append(result)
    return runs


def run_and_store(
    workload: Workload | str, config: TrainConfig | None = None, *, store: StoreArg = DEFAULT_STORE, **options: Any
) -> TrialResult:
    """`run_trial`, with the result saved to `store` (default: the user's run history; None: not saved)."""
    return run_trials(workload, [config or TrainConfig()], store=store, **options)[0][0]


class TrialHandle:
    """A trial or comparison running on a background thread: the caller (a notebook) stays free.

    `cancel()` stops it within about a second (the worker process is ended);
    `result(timeout)` waits for the outcome; errors in the input are re-raised there.
    """

    def __init__(self, target: Any, *args: Any, **kwargs: Any) -> None:
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._outcome: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self._outcome = target(*args, cancel=self._cancel, **kwargs)
        except BaseException as exc:  # kept for result(); a thread has nowhere else to raise
            self._error = exc
        finally:
            self._done.set()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            raise TimeoutError(f"still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._outcome


def start_trial(workload: Workload | str, config: TrainConfig | None = None, **options: Any) -> TrialHandle:
    """`run_and_store` on a background thread; same arguments (except `cancel`, which the handle owns)."""
    return TrialHandle(run_and_store, workload, config, **options)


def start_comparison(
    workload: Workload | str, baseline: TrainConfig, candidates: Sequence[TrainConfig], **options: Any
) -> TrialHandle:
    """`run_comparison` on a background thread."""
    return TrialHandle(run_comparison, workload, baseline, candidates, **options)
