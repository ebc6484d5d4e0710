"""`Finding`: one thing a diagnosis found, with its evidence and ranked recommendations.

Its own module so that every detector (the phases and profile in `diagnose`, utilization, the
per-rank figures of distributed trials) returns the same type without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from workbench.analysis.advice import Recommendation

Kind = Literal["data", "overhead", "sync", "compute", "memory-bandwidth", "memory", "distributed", "threads", "compile"]
Severity = Literal["bottleneck", "info"]


@dataclass
class Finding:
    kind: Kind
    severity: Severity
    title: str
    summary: str
    """One sentence with the evidence numbers."""
    evidence: dict[str, Any]
    score: float
    """About how much of the step this explains (0-1), for ordering findings."""
    recommendations: list[Recommendation] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "recommendations"}
        data["recommendations"] = [r.to_dict() for r in self.recommendations]
        return data
