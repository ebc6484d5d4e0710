"""The public API the CLI, the notebook app and the server share: run one trial, run a comparison.

Thin on purpose: trials come from `measure`, statistics from `analysis`, and the order and
number of units of a comparison from `protocol`; this module only wires them together.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from workbench.analysis.loader_bound import LoaderBound
from workbench.analysis.workers import WorkerScaling
from workbench.config import ConfigError, TrainConfig
from workbench.measure import EventSink, TrialRequest, TrialResult
from workbench.protocol import ComparisonRun, Protocol, run_protocol
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.trials import run_request
from workbench.workloads import Workload

__all__ = [
    "ComparisonRun",
    "Protocol",
    "TrialHandle",
    "loader_bound",
    "run_and_store",
    "run_comparison",
    "run_trials",
    "start_comparison",
    "start_trial",
    "workers_enough",
]


run_comparison = run_protocol
"""Compare candidates with the baseline by the calibrated protocol (`workbench.protocol.run_protocol`):
a fresh trial of each, then rounds until every interval is within ±`protocol.precision` or
`protocol.budget_s` is spent. Every fresh trial is saved to `store` (None: not saved)."""


def loader_bound(
    workload: Workload | str,
    config: TrainConfig | None = None,
    protocol: Protocol | None = None,
    **options: Any,
) -> LoaderBound:
    """What the data pipeline costs `config`'s step: its step with the real loader against the same
    step on a few real batches already staged on the device, by the calibrated protocol.

    "the data pipeline costs 38% of the step [34, 42]; no loader change can beat 61 ms/step" is
    `.sentence()`. Options are `run_comparison`'s (steps, device, preset, store, on_event, ...)."""
    run = run_comparison(workload, config or TrainConfig(), [], protocol, ideal_loader=True, **options)
    bound = run.loader_bound
    assert bound is not None  # ideal_loader=True always measures the bound's row
    return bound


def workers_enough(
    workload: Workload | str,
    config: TrainConfig | None = None,
    *,
    counts: Sequence[int] | None = None,
    **options: Any,
) -> WorkerScaling:
    """The smallest num_workers at which the loader stops being the bound, measured and verified.

    Three measurements, each a fresh trial: the step on batches staged on the device (the compute,
    what enough workers should reach); one batch's cost, timed inside one loader worker; then the
    sweep of worker counts (`counts`, default 0 up to one past the recommendation, at most the
    cores), which verifies the recommendation and shows where adding workers stopped paying.
    Options are `run_trial`'s (steps, warmup, device, preset, store, ...)."""
    from dataclasses import replace

    from workbench.analysis.workers import workers_needed
    from workbench.measure.staged import IDEAL_BATCHES

    config = config or TrainConfig()
    staged = run_and_store(workload, config, staged_batches=IDEAL_BATCHES, **options)
    probe = run_and_store(workload, replace(config, num_workers=1), data_stages=True, **options)
    for trial in (staged, probe):
        if not trial.ok or trial.median_step_ms is None:
            raise ConfigError(f"cannot size the loader: a trial ended '{trial.status}': {trial.message[:200]}")
    assert probe.data_stages is not None and staged.median_step_ms is not None  # both trials ran
    compute_ms = staged.median_step_ms
    prepare = [fetch["prepare_ms"] for fetch in probe.data_stages["fetches"]]
    cores = int(probe.device.get("cpu_cores") or 1)
    advice = workers_needed(sum(prepare) / len(prepare), compute_ms, cores)
    scaling = WorkerScaling(advice, compute_ms, samples_per_step=staged.samples_per_step)
    for count in counts if counts is not None else range(min(cores, advice.workers + 1) + 1):
        trial = run_and_store(workload, replace(config, num_workers=count, persistent_workers=count > 0), **options)
        if trial.ok and trial.median_step_ms is not None:
            scaling.steps_ms[count] = trial.median_step_ms
    if advice.workers not in scaling.steps_ms:
        trial = run_and_store(workload, replace(config, num_workers=advice.workers, persistent_workers=True), **options)
        if trial.ok and trial.median_step_ms is not None:
            scaling.steps_ms[advice.workers] = trial.median_step_ms
    return scaling


def run_trials(
    workload: Workload | str,
    configs: Sequence[TrainConfig],
    *,
    repeats: int = 1,
    labels: Sequence[str] = (),
    kind: str = "run",
    run_label: str = "",
    store: StoreArg = DEFAULT_STORE,
    on_event: EventSink | None = None,
    cancel: threading.Event | None = None,
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
    request = TrialRequest.of(workload, **trial_options)  # bad options fail here, before any trial
    runs: list[list[TrialResult]] = [[] for _ in configs]
    with opened_store(store) as history:
        recorder = history.recorder(kind, label=run_label) if history is not None else None
        for _ in range(repeats):
            for index, config in enumerate(configs):
                result = run_request(request.with_config(config), on_event, cancel)
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
