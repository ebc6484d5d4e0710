"""Stage markers in a watched job's own Dataset: each step's data preparation split by `wb.stage`.

Without loader workers the Dataset runs inside `w.batches(...)`'s wait, where a collector is on.
With workers it runs in their processes, so the watch iterates a copy of the user's DataLoader
(the user's own object is left as it was) whose workers collect for their whole life and whose
collate hands each batch's stage times over with the batch: a worker makes one batch at a time,
so the markers since its last collate are that batch's. The loop still gets the user's batch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from workbench.workloads.stages import collect_from_now, take_collected


@dataclass
class StagedBatch:
    """A batch made in a loader worker, with the stage times its making took (ms per stage)."""

    batch: Any
    ms: dict[str, float]

    def pin_memory(self) -> StagedBatch:
        """The loader's pin-memory thread calls this on objects it does not know: pin the batch inside."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return StagedBatch(pin_memory(self.batch), self.ms)


class CollectInWorker:
    """A loader worker's init: collect its markers from its start, then the user's own init."""

    def __init__(self, inner: Callable[[int], None] | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        collect_from_now()
        if self.inner is not None:
            self.inner(worker_id)


class CarryStages:
    """A loader worker's collate: the user's, its result carrying the stage times of its batch."""

    def __init__(self, inner: Callable[[list[Any]], Any]) -> None:
        self.inner = inner

    def __call__(self, items: list[Any]) -> StagedBatch:
        batch = self.inner(items)
        return StagedBatch(batch, take_collected())


def carrying_stages(iterable: Iterable[Any]) -> Iterable[Any]:
    """`iterable` itself, or for a DataLoader with workers a copy whose batches carry their stage times."""
    from torch.utils.data import DataLoader

    if not isinstance(iterable, DataLoader) or iterable.num_workers == 0:
        return iterable
    loader = copy.copy(iterable)
    loader._iterator = None  # persistent workers: the copy starts (and keeps) its own
    loader.collate_fn = CarryStages(iterable.collate_fn)
    loader.worker_init_fn = CollectInWorker(iterable.worker_init_fn)
    return loader
