"""Sequence parallelism (Megatron-SP): inside a tensor-parallel region, split the residual stream
and the norms along the sequence instead of repeating them on every rank.

It is a variant of the tensor-parallel plan, not a step of its own: a column-wise layer then
all-gathers its sequence-split input, a row-wise one reduce-scatters its output (the same bytes
as TP's all-reduce), and the activations between them take 1/degree of the memory. So the
tensor_parallel lever applies it, asking this module for each style's variant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.levers.base import Lever, always
from workbench.levers.tp_plan import matching
from workbench.workloads.base import Workload, move_batch

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

SEQUENCE_DIM = 1
"""Activations are (batch, sequence, features) in every plan here, as in Megatron and torchtitan."""


def sequence_style(name: str) -> ParallelStyle | None:
    """The style a plan entry takes under sequence parallelism; None leaves the module alone."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    split = Shard(SEQUENCE_DIM)
    if name == "colwise":
        return ColwiseParallel(input_layouts=split)  # all-gather the sequence, then split the features
    if name == "rowwise":
        return RowwiseParallel(output_layouts=split)  # reduce-scatter the partial sums along the sequence
    if name == "sequence_parallel":
        return SequenceParallel(sequence_dim=SEQUENCE_DIM)
    if name == "sequence_region":
        # Enter split along the sequence, leave whole: what runs outside the region sees full tensors.
        return PrepareModuleInputOutput(
            input_layouts=Replicate(),
            desired_input_layouts=split,
            use_local_input=True,
            output_layouts=split,
            desired_output_layouts=Replicate(),
        )
    return None


def regions(plan: dict[str, Any]) -> list[str]:
    """The plan's sequence regions: without one, nothing would split the sequence."""
    return [pattern for pattern, style in plan.items() if style == "sequence_region"]


def sequence_lengths(workload: Workload, config: TrainConfig, plan: dict[str, Any], model: nn.Module) -> dict[str, int]:
    """The sequence length entering each sequence region, from one forward of `model` (built on the
    meta device: shapes only, no memory, no compute), so the check comes before any rank starts.
    A model whose forward cannot run there gives none: `guard_sequence` then checks in the ranks."""
    targets = [(pattern, module) for pattern in regions(plan) for _, module in matching(model, pattern)]
    if not targets:
        return {}
    lengths: dict[str, int] = {}
    handles = [
        module.register_forward_pre_hook(_recorder(lengths, pattern), with_kwargs=True) for pattern, module in targets
    ]
    one_batch = config.replace(num_workers=0, persistent_workers=False, prefetch_factor=None, pin_memory=False)
    batch = next(iter(workload.make_loader(one_batch)))
    try:
        with torch.no_grad():
            workload.forward_fn(model, move_batch(batch, "meta"))
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return lengths  # e.g. a data-dependent branch (.item()) has no value on meta
    finally:
        for handle in handles:
            handle.remove()
    return lengths


def _recorder(lengths: dict[str, int], pattern: str) -> Any:
    def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        first = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(first, torch.Tensor) and first.dim() > SEQUENCE_DIM:
            lengths[f"{pattern} sequence length"] = int(first.shape[SEQUENCE_DIM])

    return record


def guard_sequence(model: nn.Module, plan: dict[str, Any], degree: int) -> None:
    """Refuse, at the first forward, a sequence the degree does not divide (when the up-front check
    could not run the model on the meta device): uneven shards would fail deep in a collective."""

    def check(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        lengths: dict[str, int] = {}
        _recorder(lengths, "the sequence region")(module, args, kwargs)
        for name, length in lengths.items():
            if length % degree:
                raise ConfigError(
                    f"sequence_parallel with tensor_parallel={degree}: {name} = {length} does not divide by "
                    f"{degree}; set sequence_parallel=false, or a sequence length that divides"
                )

    for pattern in regions(plan):
        for _, module in matching(model, pattern):
            module.register_forward_pre_hook(check, with_kwargs=True, prepend=True)


def require_region(plan: dict[str, Any], workload_name: str) -> None:
    """Refuse sequence parallelism for a plan that names no region to split."""
    if not regions(plan):
        raise ConfigError(
            "sequence_parallel needs a 'sequence_region' entry in the tp_plan (the stack whose input is split "
            "along the sequence and whose output is gathered again, with its norms as 'sequence_parallel'); "
            f"workload '{workload_name}' has none: add one, or set sequence_parallel=false"
        )


def sequence_sizes(workload: Workload, config: TrainConfig, plan: dict[str, Any], model: nn.Module) -> dict[str, int]:
    """What sequence parallelism splits (each region's sequence length), for the degree check;
    refuses a plan without a region."""
    require_region(plan, workload.name)
    return sequence_lengths(workload, config, plan, model)


LEVER = Lever(
    name="sequence_parallel",
    fields=("sequence_parallel",),
    summary="split the norms and residual stream along the sequence inside tensor parallelism: "
    "activations / degree there, same communication bytes",
    availability=always("sequence_parallel"),
    not_in_step="applied by the tensor_parallel lever, as the sequence-split variant of its plan's styles",
    not_exported="a tensor-parallel run is exported as its torchrun command (`workbench export --format command`), "
    "whose ranks build the same mesh and apply the same plan",
    not_searched="distributed tuning is not supported yet; tune one process, then scale out",
    fixed={"sequence_parallel": "distributed tuning is not supported yet; tune one process, then scale out"},
)
