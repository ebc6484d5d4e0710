"""Which rank of which multi-process job a watched process is, so a reader joins the ranks of one launch.

The rank and world size come from torch.distributed when it is initialized, else from the
variables torchrun sets (RANK, WORLD_SIZE). The job every rank shares must differ between two
launches of the same script (torchrun's defaults repeat: rendezvous id 'none', port 29500), so
the first rank to ask puts a fresh id in the process group's own key-value store (a
compare-and-set: no collective, nothing on a GPU stream, no rank waits for another) and every
rank reads the same id back. It is asked from the watch's writer thread, never the training
loop. Without a process group the launch's environment stands in, with the agent's process
(the ranks' parent) to tell repeated launches apart on one host.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int | None = None
    world_size: int | None = None
    job: str | None = None
    """Shared by every rank of one launch; None for a single process."""


def rank_info(name: str) -> RankInfo:
    """This process's place in a multi-process job, or `RankInfo()` when it is a single process."""
    rank, world = _rank_and_world()
    if world is None or world < 2 or rank is None:
        return RankInfo()
    return RankInfo(rank, world, _shared_job_id(name) or _launch_job_id(name))


def _rank_and_world() -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # a half-torn-down group: fall back to the launcher's variables
        pass
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None, None


def _shared_job_id(name: str) -> str | None:
    """An id set once per process group in its store: the same for every rank, new for every launch."""
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store

        if not (dist.is_available() and dist.is_initialized()):
            return None
        store = _get_default_store()
        mine = uuid.uuid4().hex[:12]
        shared = store.compare_set(f"workbench/watch/{name}", "", mine)
        return f"{name}@{shared.decode() if isinstance(shared, bytes) else shared}"
    except Exception:  # an old torch or a store without compare_set: the environment stands in
        return None


def _launch_job_id(name: str) -> str:
    env = os.environ
    where = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    run = env.get("TORCHELASTIC_RUN_ID", "")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{name}@{where}/{run}/{restart}/agent-{os.getppid()}"
