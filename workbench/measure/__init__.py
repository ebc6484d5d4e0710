"""Measured training windows: the request, the events, the result (`workbench.trials.run_trial` runs one)."""

from workbench.measure.compile_cache import cold_compile
from workbench.measure.events import (
    Event,
    EventSink,
    RoundMeasured,
    StepMeasured,
    TrialFinished,
    TrialStarted,
)
from workbench.measure.request import TrialRequest
from workbench.measure.result import STATUSES, TrialResult

__all__ = [
    "STATUSES",
    "Event",
    "EventSink",
    "RoundMeasured",
    "StepMeasured",
    "TrialFinished",
    "TrialRequest",
    "TrialResult",
    "TrialStarted",
    "cold_compile",
]
