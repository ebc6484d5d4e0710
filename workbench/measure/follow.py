"""`EventRelay`: a trial's messages from another process → the caller's events and result.

The trial worker (a pipe) and the torchrun ranks (per-rank files) send the same messages:
("event", Event), ("input_error", kind, text), and their own failure kinds. The relay forwards
events, keeps what it has seen so a trial that never finishes still reports its steps, and
raises input errors in the caller as the error types the caller would have raised itself.
What to do about silence, death and cancel stays with each transport's follower.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.measure.events import EventSink, StepMeasured, TrialFinished, TrialStarted
from workbench.measure.result import TrialResult
from workbench.workloads.base import WorkloadError

STARTUP_GRACE_S = 60.0
"""Added to a trial's silence limit until it has started: spawning, `import torch` and building
take 3-30 s on a busy machine, and must not count as a hang."""
_INPUT_ERRORS: dict[str, type[Exception]] = {"ConfigError": ConfigError, "WorkloadError": WorkloadError}


def raise_input_error(kind: str, text: str) -> None:
    """An input error found in another process, raised here as the type it had there."""
    raise _INPUT_ERRORS.get(kind, ConfigError)(text)


class EventRelay:
    """Forward events; remember the steps seen; end a trial that never finished with a status."""

    def __init__(self, name: str, config: TrainConfig, on_event: EventSink | None) -> None:
        self.emit = on_event or (lambda event: None)
        self.partial = TrialResult(trial_id="", status="ok", workload=name, config=config.to_dict())
        self.finished: TrialResult | None = None
        self.began = time.monotonic()
        self.started_s: float | None = None
        """Seconds from launch to the trial's TrialStarted (process start-up, imports)."""

    def handle(self, message: tuple[Any, ...]) -> bool:
        """Take one message; False if it is not one of the shared kinds (the follower's own)."""
        kind = message[0]
        if kind == "event":
            event = message[1]
            self._observe(event)
            self.emit(event)
            if isinstance(event, TrialFinished):
                self.finished = event.result
            return True
        if kind == "input_error":
            raise_input_error(str(message[1]), str(message[2]))
        return False

    def end(self, status: str, message: str) -> TrialResult:
        """The trial as far as it got, with `status` and `message`; announced as finished."""
        r = self.partial
        r.status, r.message = status, message  # type: ignore[assignment]
        r.trial_id = r.trial_id or uuid.uuid4().hex[:12]
        r.wall_time_s = time.monotonic() - self.began
        self.emit(TrialFinished(r.trial_id, r))
        return r

    def _observe(self, event: Any) -> None:
        r = self.partial
        if isinstance(event, TrialStarted):
            r.trial_id, r.warmup, r.steps = event.trial_id, event.warmup, event.steps
            self.started_s = time.monotonic() - self.began
        elif isinstance(event, StepMeasured):
            (r.step_ms if event.timed else r.warmup_step_ms).append(event.step_ms)
            if event.loss is not None:
                r.losses.append(event.loss)
