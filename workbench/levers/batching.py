"""Batch size and gradient accumulation: how many samples one optimizer step sees, in how many pieces.

A larger micro-batch fills the device better; accumulation keeps the optimizer's batch while
holding fewer activations at a time. `TrainStep` runs the micro-batches itself (each loss divided
by their count); this module only records the choice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from workbench.config import TrainConfig
from workbench.levers.base import Lever, Space, SpaceContext, Table
from workbench.levers.fragment import Snippet
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


def apply_grad_accumulation(steps: int) -> Applied | None:
    """The record of accumulation over `steps` micro-batches (None for one: nothing to say)."""
    if steps <= 1:
        return None
    return Applied(
        "grad_accumulation", steps, f"{steps} micro-batches per optimizer step, each loss divided by {steps}"
    )


def _availability(dev: torch.device) -> Table:
    return {}  # any positive size runs anywhere; what fits in memory is the estimator's question


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    snippet.constants.append(f"GRAD_ACCUMULATION = {config.grad_accumulation}  # micro-batches per optimizer step")
    if config.batch_size is not None:
        snippet.constants.append(f"BATCH_SIZE = {config.batch_size}  # samples per micro-batch")
        snippet.loader_batch_default = " = BATCH_SIZE"


def _space(ctx: SpaceContext) -> Space:
    """Batch sizes around the workload's default; with a global batch, its divisors (accumulation
    then follows the size, so it is not searched itself)."""
    batch = ctx.workload_batch
    sizes = sorted({max(1, batch // 2), batch, batch * 2})
    if ctx.global_batch is not None:
        divisors = [d for d in range(1, ctx.global_batch + 1) if ctx.global_batch % d == 0]
        sizes = [s for s in divisors if batch // 4 <= s <= ctx.global_batch] or [ctx.global_batch]
    return {"batch_size": tuple(sizes)}


def _apply(step: TrainStep) -> None:
    record = apply_grad_accumulation(step.config.grad_accumulation)
    if record is not None:
        step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return "samples per micro-batch" if name == "batch_size" else "micro-batches per optimizer step"


LEVER = Lever(
    name="batching",
    fields=("batch_size", "grad_accumulation"),
    summary="samples per micro-batch and micro-batches per step: device utilisation against memory",
    availability=_availability,
    open_fields=("batch_size", "grad_accumulation"),
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
