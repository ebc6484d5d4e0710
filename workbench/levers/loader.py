"""The data loader's settings: worker processes, pinned memory, prefetching, persistent workers.

They act outside the step (the trial's loader and the exported `make_loader`), so `build()` has
nothing to apply: a loader-bound step (the GPU waiting for batches) is what they fix.
"""

from __future__ import annotations

import torch

from workbench.device import ALWAYS, Availability
from workbench.levers.base import Lever, Table, always, probed


def pin_memory_availability(value: bool, dev: torch.device) -> Availability:
    if not value or dev.type == "cuda":
        return ALWAYS
    return Availability(False, "pinned memory speeds host-to-GPU copies; there is no GPU to copy to")


def _availability(dev: torch.device) -> Table:
    return {**probed(pin_memory=pin_memory_availability)(dev), **always("persistent_workers")(dev)}


LEVER = Lever(
    name="data_loader",
    fields=("num_workers", "pin_memory", "prefetch_factor", "persistent_workers"),
    summary="load batches in worker processes, pinned and ahead of time: for steps that wait on data",
    availability=_availability,
    open_fields=("num_workers", "prefetch_factor"),
)
