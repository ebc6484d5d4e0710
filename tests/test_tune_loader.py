"""The tuner stops searching the loader levers once the loader costs the step nothing measurable."""

from __future__ import annotations

import threading
from typing import Any

from slow_data_workload import slow_data_workload

import workbench as wb
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.tune.loader_settle import settled_by_trial
from workbench.tune.objective import Objective
from workbench.tune.screening import Screening
from workbench.tune.space import user_space


def _result(step_ms: float, data_ms: float, **config: Any) -> TrialResult:
    return TrialResult(
        trial_id=f"t{step_ms}{data_ms}{sorted(config.items())}",
        status="ok",
        workload="w",
        config=TrainConfig(**config).to_dict(),
        step_ms=[step_ms] * 5,
        phase_ms={"data": [data_ms] * 5},
        samples_per_step=4,
        losses=[1.0] * 8,
    )


def test_a_trial_that_waits_for_no_data_settles_the_searched_loader_fields() -> None:
    searched = ["num_workers", "channels_last"]
    assert settled_by_trial(_result(50.0, 0.5, num_workers=2), searched, 0.03) == {"num_workers": 2}
    assert settled_by_trial(_result(50.0, 10.0, num_workers=1), searched, 0.03) is None  # 20% waiting
    assert settled_by_trial(_result(50.0, 0.5), ["channels_last"], 0.03) is None  # no loader field searched


class _Measure:
    def __init__(self) -> None:
        self.calls: list[TrainConfig] = []

    def __call__(self, config: TrainConfig, on_event: Any, cancel: threading.Event) -> TrialResult:
        self.calls.append(config)
        return _result(
            20.0 + config.num_workers,
            0.0,
            num_workers=config.num_workers,
            channels_last=config.channels_last,
            batch_size=config.batch_size,
        )


def test_pinned_fields_are_no_longer_proposed() -> None:
    space = user_space({"num_workers": [0, 1, 2], "channels_last": [False, True], "batch_size": [2, 4]}, "cpu")
    measure = _Measure()
    screening = Screening(space, TrainConfig(), _result(30.0, 0.0), Objective("step-time"), measure, device="cpu")
    screening.pin({"num_workers": 1, "not_searched": 3})
    assert screening.pinned == {"num_workers": 1}
    for _ in range(40):
        if screening.exhausted:
            break
        screening.step()
    assert measure.calls and all(config.num_workers == 1 for config in measure.calls)
    assert len(measure.calls) == 4  # the other levers' 2 x 2 points, each once


def test_tune_stops_searching_the_loader_once_a_trial_waits_for_nothing() -> None:
    space = {"num_workers": [0, 1], "optimizer_impl": ["for-loop", "foreach"]}
    # A worker that keeps up still leaves ~1-1.5 ms of fetch (IPC, collation) in a 26 ms step here, 4-6%:
    # "within noise" is relative to the precision asked, so this asks ±10% (at ±3% that share is real).
    protocol = wb.Protocol(precision=0.10)
    result = wb.tune(
        slow_data_workload(sample_ms=3.0), budget_s=30, space=space, steps=6, warmup=1, store=None, protocol=protocol
    )
    settled = [note for note in result.notes if note.startswith("loader levers settled at num_workers=")]
    assert settled, result.notes
    value = int(settled[0].split("num_workers=")[1].split(":")[0])
    screened = [t for t in result.screening.trials if t.stage == "screen"]  # type: ignore[union-attr]
    first = next(i for i, t in enumerate(screened) if t.config["num_workers"] == value and t.result is not None)
    assert all(t.config["num_workers"] == value for t in screened[first:])  # pinned from then on
