"""The data loader's settings: worker processes, pinned memory, prefetching, persistent workers.

They act outside the step (the trial's loader and the exported `make_loader`), so `build()` has
nothing to apply: a loader-bound step (the GPU waiting for batches) is what they fix.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.config import TrainConfig
from workbench.device import ALWAYS, Availability
from workbench.levers.base import Lever, Space, SpaceContext, Table, always, probed
from workbench.levers.fragment import Snippet


def pin_memory_availability(value: bool, dev: torch.device) -> Availability:
    if not value or dev.type == "cuda":
        return ALWAYS
    return Availability(False, "pinned memory speeds host-to-GPU copies; there is no GPU to copy to")


def _availability(dev: torch.device) -> Table:
    return {**probed(pin_memory=pin_memory_availability)(dev), **always("persistent_workers")(dev)}


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.num_workers > 0:
        snippet.loader_args.append(f"num_workers={config.num_workers}  # load batches in worker processes")
        if config.prefetch_factor is not None:
            snippet.loader_args.append(f"prefetch_factor={config.prefetch_factor}  # batches each worker loads ahead")
        if config.persistent_workers:
            snippet.loader_args.append("persistent_workers=True  # keep the workers between epochs")
    if config.pin_memory and snippet.on_cuda:
        snippet.loader_args.append("pin_memory=True  # page-locked batches: asynchronous copies to the GPU")
        snippet.to_device = [
            "# From pinned memory the copies run asynchronously, overlapping compute.",
            "batch = to_device(batch, non_blocking=True)",
        ]


def _space(ctx: SpaceContext) -> Space:
    """Workers up to the cores there are; pinned memory where there is a GPU to copy to."""
    return {
        "pin_memory": ctx.available("pin_memory"),
        "num_workers": (0, *(n for n in (2, 4, 8) if n <= ctx.cpu_cores)),
    }


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return {
        "num_workers": "DataLoader worker processes",
        "pin_memory": "page-locked batches for asynchronous copies to the GPU",
        "prefetch_factor": "batches each loader worker loads ahead",
        "persistent_workers": "loader workers stay alive between epochs",
    }.get(name)


LEVER = Lever(
    name="data_loader",
    fields=("num_workers", "pin_memory", "prefetch_factor", "persistent_workers"),
    summary="load batches in worker processes, pinned and ahead of time: for steps that wait on data",
    availability=_availability,
    open_fields=("num_workers", "prefetch_factor"),
    snippet=_snippet,
    space=_space,
    not_in_step="the loader is built beside the step (workbench.workloads) and feeds it batches from outside",
    describe=_describe,
)
