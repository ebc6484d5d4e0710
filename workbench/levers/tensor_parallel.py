"""Tensor parallelism (Megatron-style, on DTensor): split the layers a plan names over the tp ranks
of a dp × tp device mesh, so each rank holds and computes 1/degree of them.

Applied before activation checkpointing and compile, which then wrap and trace the parallelized
blocks, and before FSDP2, which shards what remains over dp — torchtitan's order. The cost is
one all-reduce per row-wise layer in forward and in backward, on the critical path: it pays
where the ranks share a fast link (one node), while FSDP2's gathers overlap with compute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability, distributed_backend
from workbench.levers import sequence_parallel
from workbench.levers.base import Lever, Table
from workbench.levers.distributed import world_size_availability
from workbench.levers.record import Applied
from workbench.levers.tp_plan import COLWISE, SEQUENCE, check_divides, plan_for, split_sizes
from workbench.workloads.base import Workload

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

    from workbench.levers.build import TrainStep

MESH_DIMS = ("dp", "tp")
"""The mesh's dimensions: rank r sits at (r // tp, r % tp), so a tp group is tp consecutive ranks
(one node's fast link first, as torchrun numbers them) and they all train the same batch."""
DEGREES_SHOWN = (1, 2, 4, 8)


def device_mesh(config: TrainConfig, device: torch.device) -> DeviceMesh:
    """The 2-D mesh dp × tp over every rank torchrun started."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            f"tensor_parallel={config.tensor_parallel} needs an initialized process group: run the trial through "
            "run_trial (which launches torchrun) or `torchrun ... -m workbench.distributed`"
        )
    world, degree = dist.get_world_size(), config.tensor_parallel
    if world % degree:
        raise ConfigError(f"tensor_parallel={degree} does not divide the {world} ranks started (dp × tp = ranks)")
    return init_device_mesh(device.type, (world // degree, degree), mesh_dim_names=MESH_DIMS)


def parallel_style(style: Any, sequence_split: bool) -> ParallelStyle | None:
    """The DTensor style for one plan entry; None leaves that module as it is."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if not isinstance(style, str):
        return style  # the user's own ParallelStyle
    if sequence_split and (variant := sequence_parallel.sequence_style(style)) is not None:
        return variant
    if style in SEQUENCE:
        return None  # without sequence parallelism, norms and the residual stream stay whole
    if style == "colwise":
        return ColwiseParallel()
    if style in COLWISE:  # the vocabulary projection: split the vocabulary, gather the logits
        return ColwiseParallel(output_layouts=Replicate())
    if style == "embedding_rowwise":  # token ids arrive whole; each rank looks up its part of the vocabulary
        return RowwiseParallel(input_layouts=Replicate())
    return RowwiseParallel()


def apply_tensor_parallel(model: nn.Module, plan: dict[str, Any], mesh: DeviceMesh, sequence_split: bool) -> None:
    """`parallelize_module` with the plan's styles on the tp mesh (in place)."""
    from torch.distributed.tensor.parallel import parallelize_module

    styles = {pattern: s for pattern, style in plan.items() if (s := parallel_style(style, sequence_split)) is not None}
    parallelize_module(model, mesh, styles)


def check_model_parallel(workload: Workload, config: TrainConfig) -> None:
    """Refuse, before any rank starts, a model without a plan or one the degree does not divide:
    heads, split widths and vocabulary from the model's shapes (built on the meta device, free),
    and under sequence parallelism the sequence length from one forward there."""
    if config.tensor_parallel == 1:
        return
    model = shapes_only(workload)
    plan, _ = plan_for(workload, model)
    sizes = split_sizes(model, plan)
    if config.sequence_parallel:
        sizes.update(sequence_parallel.sequence_sizes(workload, config, plan, model))
    check_divides(sizes, config.tensor_parallel, f"workload '{workload.name}'")


def shapes_only(workload: Workload) -> nn.Module:
    """The workload's model on the meta device (no memory); built for real on the CPU when its
    code cannot run there (e.g. it reads a weight's value while initializing)."""
    try:
        with torch.device("meta"):
            return workload.model_fn()
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return workload.model_fn()


def local_parameter_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank holds: a DTensor counts its local shard."""
    from torch.distributed.tensor import DTensor

    total = 0
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size()
    return total


def _apply(step: TrainStep) -> None:
    """Before checkpointing, compile and FSDP2: they wrap, trace and shard the split model."""
    config = step.config
    if config.tensor_parallel == 1:
        return
    model = step.base_model
    plan, source = plan_for(step.workload, model)
    check_divides(split_sizes(model, plan), config.tensor_parallel, f"workload '{step.workload.name}'")
    if config.sequence_parallel:
        sequence_parallel.require_region(plan, step.workload.name)
        sequence_parallel.guard_sequence(model, plan, config.tensor_parallel)
    whole = local_parameter_bytes(model)
    step.device_mesh = device_mesh(config, step.device)
    tp_mesh = step.device_mesh["tp"]
    apply_tensor_parallel(model, plan, tp_mesh, config.sequence_parallel)
    held = local_parameter_bytes(model)
    step.applied.append(
        Applied(
            "tensor_parallel",
            config.tensor_parallel,
            f"parallelize_module over tp={tp_mesh.size()} of a dp {step.device_mesh['dp'].size()} × tp "
            f"{tp_mesh.size()} mesh, plan from {source} ({len(plan)} entries); this rank holds "
            f"{held / 2**20:.2f} of {whole / 2**20:.2f} MiB of parameters before any data-parallel sharding",
        )
    )
    if config.sequence_parallel:
        step.applied.append(
            Applied(
                "sequence_parallel",
                True,
                f"norms and residual stream inside {', '.join(sequence_parallel.regions(plan))} split along the "
                f"sequence over {tp_mesh.size()} ranks: all-gather before column-wise layers, reduce-scatter after "
                "row-wise ones",
            )
        )


def degree_availability(degree: int, dev: torch.device) -> Availability:
    if degree == 1:
        return ALWAYS
    import torch.distributed as dist

    if not dist.is_available():
        return Availability(False, "this PyTorch build has no torch.distributed")
    try:
        import torch.distributed.tensor.parallel  # noqa: F401
    except ImportError as exc:
        return Availability(False, f"DTensor tensor parallelism does not import here: {exc}")
    world = world_size_availability(degree, dev)
    if not world.available:
        return world
    if distributed_backend(dev) == "gloo":
        return Availability(True, "DTensor over gloo ranks on CPU: shows the layout and its collectives, not GPU speed")
    return ALWAYS


def _availability(dev: torch.device) -> Table:
    return {"tensor_parallel": {degree: degree_availability(degree, dev) for degree in DEGREES_SHOWN}}


def _check(config: TrainConfig, dev: torch.device) -> None:
    if config.tensor_parallel > 1:
        world = world_size_availability(config.nproc_per_node, dev)
        if not world.available:
            raise ConfigError(f"nproc_per_node={config.nproc_per_node} is not available on {dev}: {world.reason}")


_NOT_TUNED = "distributed tuning is not supported yet; tune one process, then scale out"

LEVER = Lever(
    name="tensor_parallel",
    fields=("tensor_parallel",),
    summary="split attention (by heads) and MLP layers over ranks (Megatron-style, DTensor): "
    "parameters and their gradients / degree per rank, for an all-reduce per layer",
    availability=_availability,
    check=_check,
    apply=_apply,
    not_exported="a tensor-parallel run is exported as its torchrun command (`workbench export --format command`), "
    "whose ranks build the same mesh and apply the same plan",
    not_searched=_NOT_TUNED,
    fixed={"tensor_parallel": _NOT_TUNED},
)
