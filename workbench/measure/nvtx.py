"""NVTX ranges around each step and phase on CUDA, so `nsys profile workbench run ...` shows them.

An NVTX push/pop costs about a microsecond when no tool listens, so the ranges stay on in the
timed window. Nothing is entered on other devices (`step_ranges` returns None there), where
torch's NVTX binding is not usable. Names match the profiler's: `workbench::step N`,
`workbench::data`, `workbench::forward`, `workbench::backward`, `workbench::optimizer`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.measure.profile import RANGE_PREFIX, _PhaseRanges


class NvtxStepRanges(_PhaseRanges):
    """One step's range with its phases nested inside, driven by the step's `mark(phase)` calls."""

    def __init__(
        self,
        index: int,
        accumulation: int,
        graphed: bool,
        push: Callable[[str], Any] | None = None,
        pop: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(accumulation, graphed)
        if push is None or pop is None:
            import torch

            push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        self.index, self._push, self._pop = index, push, pop
        self._phase_open = False

    def begin(self) -> None:
        self._push(f"{RANGE_PREFIX}step {self.index}")
        super().begin()

    def end(self) -> None:
        super().end()
        self._pop()

    def _enter(self, phase: str | None) -> None:
        if self._phase_open:
            self._pop()
            self._phase_open = False
        if phase is not None:
            self._push(RANGE_PREFIX + phase)
            self._phase_open = True


def step_ranges(train_step: Any, index: int) -> NvtxStepRanges | None:
    """NVTX ranges for step `index` on a CUDA device; None (nothing entered) anywhere else."""
    if train_step.device.type != "cuda":
        return None
    return NvtxStepRanges(index, train_step.config.grad_accumulation, train_step.graphed is not None)
