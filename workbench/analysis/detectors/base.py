"""`Detector`: one finding's whole story in one declaration, and the `Evidence` every detector reads.

Detectors run in registry order over one shared `Evidence`; a later detector may corroborate an
earlier finding (add its evidence) or supersede it, and says so in its docstring, so the order in
the registry is part of the diagnosis, as the levers' order is part of the build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.advice import Context
from workbench.analysis.compare import DEFAULT_PLANNED_STEPS
from workbench.analysis.findings import Finding
from workbench.analysis.flops import Mfu
from workbench.measure.result import TrialResult


@dataclass
class Evidence:
    """What one diagnosis reads, built once from the result and shared by every detector."""

    result: TrialResult
    ctx: Context
    profile: dict[str, Any]
    """The profiled window's summary ({} without one)."""
    phases: dict[str, float]
    """Median ms per phase of the timed window."""
    mfu: Mfu
    findings: list[Finding] = field(default_factory=list)
    """The findings of the detectors before this one, in registry order."""
    baseline: TrialResult | None = None
    """The uncompiled trial this one is read against, where the caller has one (compile payback)."""
    planned_steps: int = DEFAULT_PLANNED_STEPS
    """Steps of the user's real run: the horizon a compile must pay itself back within."""

    @property
    def data_share(self) -> float:
        """The data phase's share of the median step: the part no compute-side fix can shorten."""
        return self.phases.get("data", 0.0) / self.ctx.step_ms if self.ctx.step_ms else 0.0


@dataclass(frozen=True)
class Detector:
    """One finding: what it reads, how it finds (returns new findings), and what it notes."""

    name: str
    reads: str
    """The parts of the result it reads, in words."""
    find: Callable[[Evidence], list[Finding]]
    notes: Callable[[Evidence], list[str]] | None = None
    """Why it could not judge, when that is worth saying (a reading missing or failed)."""
