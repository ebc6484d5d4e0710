"""The ideal-loader bound: what the data pipeline costs a step, from the real loader set against
batches already staged on the device (`measure.staged`), measured by the comparison protocol.

The protocol's speedup s of the staged step over the real one is the whole story: the data share
of the step is 1 - 1/s (with the interval carried through, as the map is monotonic), and the
baseline's step ÷ s is the step time no loader change can beat.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.analysis.compare import CandidateComparison, TrialSummary


@dataclass(frozen=True)
class LoaderBound:
    """The data pipeline's cost in one step, and the best step time any loader could reach."""

    loader_step_ms: float | None
    """The step with the real loader (the baseline's median)."""
    ideal_step_ms: float | None
    """The step no loader change can beat: the baseline's median ÷ the calibrated speedup."""
    data_share: float | None
    """Share of the real step the data pipeline costs (0.38 = 38%); None when not measured."""
    data_share_ci: tuple[float, float] | None
    verdict: str
    """The protocol's verdict for the staged step against the real one: 'faster' means the loader
    costs the step something; 'no significant difference' means it is not a bound."""
    units: int = 0
    half_width: float | None = None
    """The speedup interval's relative half-width: the noise a loader change must beat."""

    @classmethod
    def from_row(cls, baseline: TrialSummary, row: CandidateComparison) -> LoaderBound:
        speedup, ci = row.speedup, row.speedup_ci
        step = baseline.median_step_ms
        return cls(
            loader_step_ms=step,
            ideal_step_ms=step / speedup if step is not None and speedup else None,
            data_share=1.0 - 1.0 / speedup if speedup else None,
            data_share_ci=(1.0 - 1.0 / ci[0], 1.0 - 1.0 / ci[1]) if ci else None,
            verdict=row.verdict,
            units=row.units,
            half_width=row.half_width,
        )

    def within_noise(self, step_ms: float) -> bool:
        """Whether a step of `step_ms` is as fast as the ideal loader's, within the bound's interval."""
        if self.ideal_step_ms is None:
            return False
        return step_ms <= self.ideal_step_ms * (1.0 + (self.half_width or 0.0))

    def sentence(self) -> str:
        """'the data pipeline costs 38% of the step [34, 42]; no loader change can beat 61 ms/step'."""
        if self.data_share is None or self.ideal_step_ms is None:
            return f"the ideal-loader bound was not measured ({self.verdict})"
        interval = ""
        if self.data_share_ci is not None:
            low, high = self.data_share_ci
            interval = f" [{low * 100:.0f}, {high * 100:.0f}]"
        share = max(self.data_share, 0.0)
        if self.verdict == "no significant difference":
            return (
                f"the data pipeline costs no significant share of the step ({self.data_share:.0%}{interval}); "
                f"a loader change cannot make it faster than {self.ideal_step_ms:.0f} ms/step"
            )
        return (
            f"the data pipeline costs {share:.0%} of the step{interval}; no loader change can beat "
            f"{self.ideal_step_ms:.0f} ms/step"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sentence": self.sentence()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderBound:
        ci = data.get("data_share_ci")
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "data_share_ci"}
        return cls(**fields, data_share_ci=tuple(ci) if ci else None)  # type: ignore[arg-type]
