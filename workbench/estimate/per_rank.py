"""One rank's memory in a distributed layout, estimated in this one process: a *fake* process group
(PyTorch's own, for tracing and memory tools) of the config's world size stands in for torchrun,
so DDP, FSDP2 and DTensor build as on rank 0, and collectives run without moving data.

The estimate is rank 0's: in the layouts here every rank holds the same shapes (even shards).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from workbench.config import TrainConfig
from workbench.distributed.sharding import local_batch_size

NOTE = "per rank: rank 0 of {world} ({layout}), built over a fake process group (collectives move no data)"


@contextmanager
def fake_world(config: TrainConfig) -> Iterator[list[str]]:
    """A fake process group of the config's world for the `with` block (unless one is up); its notes."""
    import torch.distributed as dist

    if not config.launches_ranks:
        yield []
        return
    world = config.nproc_per_node * config.nnodes
    layout = f"dp {world // config.tensor_parallel} × tp {config.tensor_parallel}, strategy={config.strategy}"
    if config.tensor_parallel > 1:
        layout += "; the tracker files DTensor gradients under activations: the peak holds, that split does not"
    if dist.is_initialized():  # already a rank of a real world (a torchrun job): estimate for it
        yield [NOTE.format(world=dist.get_world_size(), layout=layout).replace(" over a fake process group", "")]
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield [NOTE.format(world=world, layout=layout)]
    finally:
        dist.destroy_process_group()


def rank_batch_size(config: TrainConfig, global_batch: int) -> int:
    """A rank's micro-batch: the global batch over the data-parallel ranks (a tp group shares one)."""
    if not config.launches_ranks:
        return global_batch
    return local_batch_size(global_batch, config.nproc_per_node * config.nnodes // config.tensor_parallel)
