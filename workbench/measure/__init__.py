"""Measured training windows: `run_trial`, its events and its result."""

from workbench.measure.compile_cache import cold_compile
from workbench.measure.events import (
    Event,
    EventSink,
    RoundMeasured,
    StepMeasured,
    TrialFinished,
    TrialStarted,
    event_to_dict,
)
from workbench.measure.result import STATUSES, TrialResult
from workbench.measure.trial import run_trial

__all__ = [
    "STATUSES",
    "Event",
    "EventSink",
    "RoundMeasured",
    "StepMeasured",
    "TrialFinished",
    "TrialResult",
    "TrialStarted",
    "cold_compile",
    "event_to_dict",
    "run_trial",
]
