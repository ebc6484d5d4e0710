"""The ideal loader: a few real batches staged on the device once, then cycled — no loader at all.

A trial fed this way takes the step time no loader change (workers, pinning, prefetch, a faster
decoder) can beat; set beside the same step fed by the real loader, by the comparison protocol,
the difference is what the data pipeline costs. The batches are the loader's own first ones
(read without worker processes: the settings only change how fast they come, never what they
hold), already moved to the device in the model's layout, so the copy is off the step too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from workbench.measure.data_stages import TimedFetches
from workbench.measure.timing import synchronize

if TYPE_CHECKING:
    from workbench.config import TrainConfig
    from workbench.levers.build import TrainStep
    from workbench.workloads import Workload

IDEAL_BATCHES = 4
"""Batches the ideal loader stages and cycles: a few, so the step sees varied data (DALI's replay
mode cycles 20) while the device holds little extra memory."""


def batch_source(
    workload: Workload, config: TrainConfig, train_step: TrainStep, staged: int, timed: bool = False
) -> Iterator[Any]:
    """The trial's batches: the workload's loader (`timed`: with each batch's stages and copy
    recorded, a `TimedFetches`), or (`staged` > 0) that many staged and cycled."""
    if timed:
        return TimedFetches(workload.batches(config, timed_stages=True), train_step)
    if staged <= 0:
        return workload.batches(config)
    plain = replace(config, num_workers=0, pin_memory=False, prefetch_factor=None, persistent_workers=False)
    loader = workload.batches(plain)
    batches = [train_step.prepare_batch(next(loader)) for _ in range(staged)]
    synchronize(train_step.device)  # staged means landed: no copy of them overlaps the first step
    return itertools.cycle(batches)
