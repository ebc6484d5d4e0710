"""What an estimate returns (`MemoryEstimate`, `BatchSizeSearch`) and the batch-size search over fake steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError
from workbench.estimate.allocator import DEFAULT_USABLE_FRACTION, device_memory_bytes

if TYPE_CHECKING:
    pass


@dataclass
class MemoryEstimate:
    device_name: str
    batch_size: int
    peak_bytes: int
    """Estimated peak allocated memory (comparable with `max_memory_allocated` on CUDA)."""
    tensor_peak_bytes: int | None
    """The same peak in exact tensor bytes (CPU); None on CUDA, where only the rounded step runs."""
    breakdown: dict[str, int]
    workspace_bytes: int
    device_memory_bytes: int | None
    modules: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error_bound_bytes: int = 0
    """The real peak may differ from `peak_bytes` by up to this (CUDA): allocator block reuse
    (<= 1 MiB per large tensor) and the cuBLAS workspaces' dependence on version and environment."""

    @property
    def fits(self) -> bool | None:
        if self.device_memory_bytes is None:
            return None
        return self.peak_bytes <= self.device_memory_bytes * DEFAULT_USABLE_FRACTION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fits"] = self.fits
        return data

    def to_text(self) -> str:
        from workbench.textfmt import format_bytes

        total = format_bytes(self.device_memory_bytes) if self.device_memory_bytes else "unknown"
        fits = {True: "fits", False: "does NOT fit", None: "?"}[self.fits]
        lines = [
            f"{self.device_name}, batch {self.batch_size}: peak ≈ {format_bytes(self.peak_bytes)} "
            f"of {total} ({fits} in {DEFAULT_USABLE_FRACTION:.0%})",
            "  " + ", ".join(f"{k} {format_bytes(v)}" for k, v in self.breakdown.items() if v),
        ]
        if self.workspace_bytes:
            lines.append(f"  + cuBLAS workspaces {format_bytes(self.workspace_bytes)}")
        top = sorted(((n, m["activations"]) for n, m in self.modules.items() if n), key=lambda kv: -kv[1])[:5]
        if top:
            lines.append("  most activations: " + ", ".join(f"{n} {format_bytes(v)}" for n, v in top))
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


@dataclass
class BatchSizeSearch:
    device_name: str
    memory_budget_bytes: int
    max_batch_size: int
    """Largest batch whose estimated peak fits the budget (0: not even batch 1)."""
    estimate: MemoryEstimate | None
    """The estimate at `max_batch_size`."""
    probes: dict[int, int] = field(default_factory=dict)
    """Every batch size tried → its estimated peak bytes."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        from workbench.textfmt import format_bytes

        head = (
            f"{self.device_name}: largest batch that fits {format_bytes(self.memory_budget_bytes)} "
            f"is {self.max_batch_size}"
        )
        return head + ("\n" + self.estimate.to_text() if self.estimate else "")


def search_batch_size(fits: Callable[[int], bool], peak: dict[int, int], budget: int, limit: int) -> int:
    """Largest size with fits(size), assuming memory grows with the batch about linearly.

    Probes 1 and 4, then secant steps through the two latest probes (a linear function is
    solved in one), then the neighbour of the best fit, then bisection for whatever is left:
    typically five fake steps instead of the dozen of doubling and bisection.
    """
    if not fits(1):
        return 0
    low, high = 1, limit + 1
    if not fits(4):
        high = 4
    else:
        low, previous, latest = 4, 1, 4
        for _ in range(4):
            slope = max(1.0, (peak[latest] - peak[previous]) / (latest - previous))
            guess = int(min(limit, max(low + 1, latest + (budget - peak[latest]) // slope)))
            if guess >= high or guess in peak:
                break
            low, high = (guess, high) if fits(guess) else (low, guess)
            previous, latest = latest, guess
        if high - low > 1 and low + 1 <= limit:
            low, high = (low + 1, high) if fits(low + 1) else (low, low + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def default_budget(device_name: str) -> int:
    total = device_memory_bytes(device_name)
    if total is None:
        raise ConfigError(
            f"device '{device_name}' is not in the peak table; pass memory_budget (bytes) or a known name "
            "such as H100, H200, A100 80GB, L40S"
        )
    return int(total * DEFAULT_USABLE_FRACTION)
