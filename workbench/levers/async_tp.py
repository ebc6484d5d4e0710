"""Async tensor parallelism: inductor splits each matmul next to a TP all-gather or reduce-scatter
into chunks and runs them while the collective moves the next chunk (micro-pipelining over
symmetric memory), so TP's communication stops waiting on the critical path.

It needs GPUs that can write into each other's memory (CUDA peer-to-peer, NVLink) and compiled
graphs, where the pass runs; so it comes after tensor parallelism, which built the tp group it
enables symmetric memory for, and is read when compile traces the step (torchtitan's order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workbench.config import ConfigError
from workbench.device import ALWAYS, Availability
from workbench.levers.base import Lever, probed
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


def async_tp_availability(value: bool, dev: torch.device) -> Availability:
    if not value:
        return ALWAYS
    if dev.type != "cuda":
        return Availability(
            False,
            "async TP overlaps TP's collectives with the matmuls through symmetric memory, which needs CUDA GPUs "
            f"with peer-to-peer access (NVLink); this device is {dev.type}",
        )
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as exc:
        return Availability(False, f"this PyTorch has no symmetric memory (torch.distributed._symmetric_memory): {exc}")
    return ALWAYS


def _apply(step: TrainStep) -> None:
    """Enable symmetric memory for the tp group and inductor's micro-pipelined TP pass."""
    if not step.config.async_tp:
        return
    if step.device_mesh is None:
        raise ConfigError("async_tp needs the tensor-parallel mesh: set tensor_parallel=2 (or more)")
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    group = step.device_mesh["tp"].get_group()
    enable_symm_mem_for_group(group.group_name)
    # Process-global: a trial runs in its own processes, so no other model sees it.
    inductor_config._micro_pipeline_tp = True
    step.applied.append(
        Applied("async_tp", True, f"symmetric memory on tp group {group.group_name}; inductor micro-pipelined TP")
    )


LEVER = Lever(
    name="async_tp",
    fields=("async_tp",),
    summary="overlap tensor parallelism's all-gathers and reduce-scatters with the matmuls (compiled, CUDA)",
    availability=probed(async_tp=async_tp_availability),
    apply=_apply,
    not_exported="a tensor-parallel run is exported as its torchrun command (`workbench export --format command`), "
    "whose ranks apply the same levers",
    not_searched="distributed tuning is not supported yet; tune one process, then scale out",
    fixed={"async_tp": "distributed tuning is not supported yet; tune one process, then scale out"},
)
