"""Batch size and gradient accumulation: how many samples one optimizer step sees, in how many pieces.

A larger micro-batch fills the device better; accumulation keeps the optimizer's batch while
holding fewer activations at a time. `TrainStep` runs the micro-batches itself (each loss divided
by their count); this module only records the choice.
"""

from __future__ import annotations

import torch

from workbench.levers.base import Lever, Table
from workbench.levers.record import Applied


def apply_grad_accumulation(steps: int) -> Applied | None:
    """The record of accumulation over `steps` micro-batches (None for one: nothing to say)."""
    if steps <= 1:
        return None
    return Applied(
        "grad_accumulation", steps, f"{steps} micro-batches per optimizer step, each loss divided by {steps}"
    )


def _availability(dev: torch.device) -> Table:
    return {}  # any positive size runs anywhere; what fits in memory is the estimator's question


LEVER = Lever(
    name="batching",
    fields=("batch_size", "grad_accumulation"),
    summary="samples per micro-batch and micro-batches per step: device utilisation against memory",
    availability=_availability,
    open_fields=("batch_size", "grad_accumulation"),
)
