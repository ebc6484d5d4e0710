"""Events a trial emits while it runs: the one stream the UI, CLI progress and the store subscribe to.

Plain, picklable dataclasses, so the same events cross from a worker process unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.measure.result import TrialResult


@dataclass(frozen=True)
class TrialStarted:
    trial_id: str
    workload: str
    config: dict[str, Any]
    warmup: int
    steps: int
    device: str


@dataclass(frozen=True)
class StepMeasured:
    trial_id: str
    step: int
    """Global step index: warm-up steps first (0..warmup-1), then the timed window."""
    timed: bool
    """False for warm-up steps, which never enter the statistics."""
    step_ms: float
    loss: float | None
    phase_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialFinished:
    trial_id: str
    result: TrialResult


@dataclass(frozen=True)
class RoundMeasured:
    """One round of a comparison's protocol: a unit of each configuration still being measured."""

    round: int
    design: str
    """'paired' (blocks in one worker) or 'processes' (a fresh trial per unit)."""
    blocks: dict[int, list[float]]
    """Config index (0 = baseline) → this round's step times for it."""
    half_widths: dict[int, float | None]
    """Candidate config index → its interval's relative half-width so far (None: too few rounds)."""
    precision: float
    elapsed_s: float
    budget_s: float


Event = TrialStarted | StepMeasured | TrialFinished | RoundMeasured
EventSink = Callable[[Event], None]
