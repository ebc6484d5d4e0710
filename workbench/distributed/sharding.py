"""Deterministic data sharding: rank r of W takes exactly its slice of each global batch.

`batch_size` is the global batch in a distributed trial. Global batch k holds samples
k*B .. k*B+B-1 (the single-process order); rank r takes the contiguous block
k*B + r*B/W .. k*B + (r+1)*B/W - 1. Averaging the ranks' gradients (what DDP and FSDP2 do)
then gives the gradient of the whole global batch, so the loss follows the single-process
run with the same global batch up to floating-point reduction order. Workloads that make
whole batches (`batch_fn`) build the global batch and keep their slice: W-fold data work for
an exact match. Caveat: BatchNorm statistics are per rank (no SyncBatchNorm), so models with
BatchNorm match less tightly.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from workbench.config import ConfigError, TrainConfig
from workbench.workloads.base import Batch, BatchFn, Workload, map_tensors

if TYPE_CHECKING:
    from torch.utils.data import Dataset


def local_batch_size(global_batch: int, world_size: int) -> int:
    """Samples per rank per micro-batch; the global batch must split evenly."""
    if global_batch % world_size:
        raise ConfigError(
            f"batch_size {global_batch} (the global batch) does not split evenly over {world_size} ranks; "
            f"set batch_size to a multiple of {world_size}"
        )
    return global_batch // world_size


def data_parallel_position(config: TrainConfig, rank: int, world_size: int) -> tuple[int, int]:
    """(this rank's data shard, how many shards): the ranks of one tensor-parallel group (tp
    consecutive ranks, the dp × tp mesh's rows) train the same batch, so there are world / tp shards."""
    return rank // config.tensor_parallel, world_size // config.tensor_parallel


def shard_workload(workload: Workload, config: TrainConfig, rank: int, world_size: int) -> tuple[Workload, TrainConfig]:
    """The workload and config rank `rank` trains on: same model and loss, its slice of the data."""
    global_batch = workload.effective_batch_size(config)
    local = local_batch_size(global_batch, world_size)
    local_config = config.replace(batch_size=local)
    if workload.batch_fn is not None:
        batch_fn = functools.partial(_sliced_batch, workload.batch_fn, global_batch, local, rank)
        return dataclasses.replace(workload, batch_fn=batch_fn), local_config
    assert workload.dataset_fn is not None
    dataset_fn = functools.partial(_rank_view, workload.dataset_fn, global_batch, local, rank)
    return dataclasses.replace(workload, dataset_fn=cast("Callable[[int], Dataset[Any]]", dataset_fn)), local_config


class RankView:
    """Sample j of rank `rank` is sample (j // local) * global + rank * local + j % local of `base`."""

    def __init__(self, base: Any, global_batch: int, local: int, rank: int) -> None:
        self.base, self.global_batch, self.local, self.rank = base, global_batch, local, rank

    def __len__(self) -> int:
        return len(self.base) // self.global_batch * self.local

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} is outside rank {self.rank}'s shard of {len(self)}")
        step, offset = divmod(index, self.local)
        return self.base[step * self.global_batch + self.rank * self.local + offset]


def _rank_view(dataset_fn: Any, global_batch: int, local: int, rank: int, seed: int) -> RankView:
    return RankView(dataset_fn(seed), global_batch, local, rank)


def _sliced_batch(batch_fn: BatchFn, global_batch: int, local: int, rank: int, size: int, generator: Any) -> Batch:
    """`batch_fn`'s global batch from the same generator, cut to this rank's rows."""
    if size != local:
        raise ConfigError(f"rank {rank} expected micro-batches of {local} samples, was asked for {size}")
    start = rank * local
    return map_tensors(batch_fn(global_batch, generator), lambda t: t[start : start + local] if t.dim() else t)
