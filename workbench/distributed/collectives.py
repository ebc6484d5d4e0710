"""Communication by collective: how many all-gathers, reduce-scatters and all-reduces one training
step issues on a rank, and their bytes, so "FSDP on 2 ranks" and "TP=2 + SP" can be compared on
what they send, not only on time.

A dispatch mode sees every collective as it is issued, whoever issues it: DDP's reducer and
FSDP2 (the c10d ops) as well as DTensor's redistributions (the functional collectives). Bytes
follow nccl-tests' convention: the size of the whole buffer (an all-gather's output, a
reduce-scatter's input, an all-reduce's tensor), comparable across collectives and world sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
KINDS = (
    ("all_gather", ("allgather", "all_gather")),
    ("reduce_scatter", ("reduce_scatter",)),
    ("all_reduce", ("allreduce", "all_reduce")),
    ("broadcast", ("broadcast",)),
    ("all_to_all", ("alltoall", "all_to_all")),
)
NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier")
"""Ops in those namespaces that move no data of their own."""


def collective_kind(op_name: str) -> str | None:
    """'all_gather', 'reduce_scatter', ... for a c10d op name; None for what is not a collective."""
    short = op_name.split(".")[1] if "." in op_name else op_name
    if any(word in short for word in NOT_COLLECTIVES):
        return None
    for kind, words in KINDS:
        if any(word in short for word in words):
            return kind
    return short


class CollectiveCounter(TorchDispatchMode):
    """Counts each collective issued while active, with the bytes of its whole buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, dict[str, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func.namespace in NAMESPACES and (kind := collective_kind(str(func))) is not None:
            entry = self.counts.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += _buffer_bytes(func.namespace, kind, args)
        return func(*args, **(kwargs or {}))


def _buffer_bytes(namespace: str, kind: str, args: tuple[Any, ...]) -> int:
    """The whole buffer: the largest tensor argument (c10d ops take the output too), except that a
    functional all-gather is given only this rank's shard and the group size after it."""
    largest = max((t.numel() * t.element_size() for t in _tensors(args)), default=0)
    if namespace != "c10d" and kind == "all_gather" and len(args) > 1 and isinstance(args[1], int):
        return largest * args[1]
    return largest


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
