"""How many loader workers are enough: from the measured cost of one batch and the step's compute.

n workers each make a batch every `batch_prepare_ms`, so they deliver n batches in that time;
the step consumes one every `compute_ms` (the step on staged batches, nothing to wait for). The
loader stops being the bound at n = ceil(batch_prepare_ms / compute_ms). Decode scales far from
linearly with workers (they share cores, caches and memory bandwidth with the step), so this is
the count to *try*; `WorkerScaling` holds the sweep that says whether it got there.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

PAYS = 1.10
"""A worker count 'pays' when it makes the step at least this much faster than the count before."""
WITHIN_BOUND = 1.10
"""The recommendation is verified when its step is within 10% of the ideal loader's."""


@dataclass(frozen=True)
class WorkerAdvice:
    workers: int
    batch_prepare_ms: float
    compute_ms: float
    cores: int
    reason: str = ""
    """Why the count cannot hide the loading (cores exhausted); '' when it can."""


def workers_needed(batch_prepare_ms: float, compute_ms: float, cores: int) -> WorkerAdvice:
    """The smallest worker count whose batches come as fast as the step uses them, capped at the cores."""
    needed = max(1, math.ceil(batch_prepare_ms / max(compute_ms, 1e-3)))
    cores = max(1, cores)
    if needed <= cores:
        return WorkerAdvice(needed, batch_prepare_ms, compute_ms, cores)
    return WorkerAdvice(
        cores,
        batch_prepare_ms,
        compute_ms,
        cores,
        f"cores exhausted: hiding a {batch_prepare_ms:.0f} ms batch behind a {compute_ms:.0f} ms step needs "
        f"{needed} workers, and there are {cores} cores; make the batch cheaper (a faster decoder, smaller "
        "files, decoding on the GPU) or the step will wait",
    )


@dataclass
class WorkerScaling:
    """The measured sweep of worker counts, and the count that is enough."""

    advice: WorkerAdvice
    ideal_step_ms: float
    """The step on batches staged on the device (no loader): what enough workers should reach."""
    steps_ms: dict[int, float] = field(default_factory=dict)
    """Median step per worker count measured."""
    samples_per_step: int = 0

    @property
    def verified(self) -> bool:
        step = self.steps_ms.get(self.advice.workers)
        return step is not None and step <= WITHIN_BOUND * self.ideal_step_ms

    def enough(self) -> int | None:
        """The smallest measured count whose step is within 10% of the ideal loader's (None: none was)."""
        within = [n for n, ms in sorted(self.steps_ms.items()) if ms <= WITHIN_BOUND * self.ideal_step_ms]
        return within[0] if within else None

    def stopped_paying(self) -> int | None:
        """The first count that was not `PAYS` faster than the one before (None: each one paid)."""
        counts = sorted(self.steps_ms)
        for before, after in itertools.pairwise(counts):
            if self.steps_ms[before] < PAYS * self.steps_ms[after]:
                return after
        return None

    def sentence(self) -> str:
        n, step = self.advice.workers, self.steps_ms.get(self.advice.workers)
        measured = f"{step:.0f} ms/step" if step is not None else "not measured"
        bound = f"the ideal loader's {self.ideal_step_ms:.0f} ms"
        enough = self.enough()
        if enough is not None and enough < n:  # measured beats the estimate: fewer workers already do it
            return (
                f"num_workers={enough} is enough: {self.steps_ms[enough]:.0f} ms/step, within 10% of {bound} "
                f"(the measured costs asked for {n})"
            )
        if self.advice.reason:
            return f"num_workers={n} ({measured}, against {bound}): {self.advice.reason}"
        if self.verified:
            return f"num_workers={n} is enough: {measured}, within 10% of {bound}"
        return f"num_workers={n} should be enough by the measured costs, but ran {measured} against {bound}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "advice": asdict(self.advice),
            "ideal_step_ms": self.ideal_step_ms,
            "steps_ms": dict(self.steps_ms),
            "verified": self.verified,
            "enough": self.enough(),
            "stopped_paying": self.stopped_paying(),
            "sentence": self.sentence(),
        }
