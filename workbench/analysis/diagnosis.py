"""`Diagnosis`: the findings of one trial, its MFU and notes, as text for the terminal and plain data.

Its own module so that the detectors' facade (`diagnose`) stays a loop over the registry, and the
views (CLI, app, watch) share one rendering of a diagnosis.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.analysis.findings import Finding
from workbench.analysis.flops import Mfu
from workbench.measure.result import TrialResult


@dataclass
class Diagnosis:
    trial_id: str
    findings: list[Finding]
    """Bottlenecks first, each group by score."""
    mfu: Mfu | None
    notes: list[str] = field(default_factory=list)

    @property
    def bottlenecks(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "bottleneck"]

    @property
    def primary(self) -> Finding | None:
        """The finding that explains most of the step."""
        return self.findings[0] if self.findings else None

    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def to_text(self, result: TrialResult | None = None) -> str:
        """Plain text for the terminal: findings, then (with the result) top operators and memory."""
        from workbench.textfmt import format_bytes, table

        lines = ["Diagnosis" + (f" — primary: {self.primary.title}" if self.primary else " — no bottleneck found")]
        for finding in self.findings:
            lines.append(f"\n[{finding.severity}] {finding.title}: {finding.summary}")
            for rec in finding.recommendations:
                change = ", ".join(f"{k}={v}" for k, v in rec.changes.items()) or "code change"
                lines.append(f"  {rec.rank}. {rec.title} [{change}] — {rec.expected}. Why: {rec.why}")
        if self.mfu is not None and self.mfu.mfu is not None:
            lines.append(f"\nMFU {self.mfu.mfu:.1%} ({self.mfu.peak_source})")
        lines += [f"note: {note}" for note in self.notes]
        if result is not None and result.median_step_ms:
            step = result.median_step_ms
            phases = ", ".join(f"{k} {v:.1f} ms ({v / step:.0%})" for k, v in result.phase_medians_ms().items())
            lines.append(f"\ntimed window: median step {step:.1f} ms; {phases}")
        profile = (result.profile if result is not None else None) or {}
        if profile.get("top_ops"):
            rows = [_op_row(r) for r in profile["top_ops"][:10]]
            lines += ["", table(["top operators", "calls/step", "self ms/step", "share", "input shapes"], rows)]
        if profile.get("trace_path"):
            lines.append(
                f"trace: {profile['trace_path']} ({format_bytes(profile['trace_bytes'])}) {profile['trace_note']}"
            )
        if result is not None and result.memory_breakdown:
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in result.memory_breakdown.items() if v)
            lines.append(f"memory at peak: {parts}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "primary": self.primary.kind if self.primary else None,
            "findings": [f.to_dict() for f in self.findings],
            "mfu": asdict(self.mfu) if self.mfu else None,
            "notes": list(self.notes),
        }


def _op_row(row: dict[str, Any]) -> list[str]:
    """One line of the top-operators table: name, calls, self time and share per step, input shapes."""
    share = f"{row['self_share']:.0%}"
    return [
        row["name"][:48],
        f"{row['calls_per_step']:g}",
        f"{row['self_ms_per_step']:.2f}",
        share,
        row["input_shapes"][:50],
    ]
