"""What a parallel layout costs per rank: the parameters it holds and what one step sends, by
collective. Pure figures over distributed results, so `compare` can set "FSDP2 on 2 ranks" beside
"TP=2 + SP" on memory and communication as well as time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.measure.result import TrialResult


def layout_cost(runs: Sequence[TrialResult]) -> dict[str, Any] | None:
    """{'parameter_bytes_per_rank': the largest rank's, 'collectives': rank 0's per step} of the
    first distributed run that has them; None for single-process runs."""
    for run in runs:
        info = run.distributed or {}
        held = [b for b in info.get("parameter_bytes") or [] if b is not None]
        counted = [c for c in info.get("collectives") or [] if c is not None]
        if held or counted:
            return {
                "parameter_bytes_per_rank": max(held) if held else None,
                "collectives": counted[0] if counted else None,
                "tensor_parallel": info.get("tensor_parallel", 1),
                "world_size": info.get("world_size"),
            }
    return None
