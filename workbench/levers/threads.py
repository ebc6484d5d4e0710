"""Intra-op CPU threads: how many threads one operator may use, scoped to the step.

`torch.set_num_threads` is process-global, like the fp32 precision flags, so it is set on
entering every step and restored on exit: a paired session alternating configurations in
one process, or an inline trial, never leaks one configuration's count into another's. The
count PyTorch picked is recorded too, so every result says how many threads its step used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import torch

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability, cpu_cores
from workbench.levers.amp import ContextFactory
from workbench.levers.base import Lever, Table
from workbench.levers.fragment import Snippet, comment
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


@contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """Run the block with `count` intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    if count != previous:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count != previous:
            torch.set_num_threads(previous)


def apply_intra_op_threads(count: int | None) -> tuple[ContextFactory | None, Applied]:
    """A context factory for the step (None: PyTorch's own count, untouched) and its record."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ConfigError(f"intra_op_threads must be a positive integer or none, got {count!r}")
    if count is None:
        current = torch.get_num_threads()
        return None, Applied("intra_op_threads", current, f"{current} intra-op thread(s): PyTorch's default here")

    def context() -> AbstractContextManager[None]:
        return intra_op_threads(count)

    return context, Applied("intra_op_threads", count, f"torch.set_num_threads({count}) for the step")


def resolved_intra_op_threads(applied: list[dict[str, object]] | None) -> int | None:
    """The thread count a trial's step ran with, from its `applied` record (None for older results)."""
    for record in applied or []:
        if record.get("toggle") == "intra_op_threads" and isinstance(record.get("value"), int):
            return int(record["value"])  # type: ignore[call-overload]
    return None


def thread_counts(cores: int) -> dict[int | None, Availability]:
    """Intra-op thread counts worth trying here (a search space for the tuner, choices for the app):
    PyTorch's own pick, powers of two below the cores, and the cores. More is allowed, never useful."""
    counts = sorted({*(2**k for k in range(cores.bit_length()) if 2**k < cores), cores})
    table: dict[int | None, Availability] = {None: Availability(True, "PyTorch's default: the cores it sees")}
    table.update(dict.fromkeys(counts, ALWAYS))
    return table


def _availability(dev: torch.device) -> Table:
    return {"intra_op_threads": dict(thread_counts(cpu_cores()))}


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.intra_op_threads is None:
        return
    why = (
        "The measured intra-op CPU thread count: with more threads than free cores (other "
        "processes, loader workers) every operator waits for the slowest thread."
    )
    code = f"torch.set_num_threads({config.intra_op_threads})"
    snippet.statements.append("\n".join([*comment(why, indent="# "), code]))


def _apply(step: TrainStep) -> None:
    """Always recorded: the count PyTorch picks differs by host."""
    step.threads, record = apply_intra_op_threads(step.config.intra_op_threads)
    step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return f"{value} CPU thread(s) per operator (torch.set_num_threads)"


LEVER = Lever(
    name="intra_op_threads",
    fields=("intra_op_threads",),
    summary="CPU threads per operator: fewer than the cores when other processes share them",
    availability=_availability,
    snippet=_snippet,
    not_searched="not in the default space: the best count depends on what else shares the host; "
    "name intra_op_threads in a space file to search it",
    apply=_apply,
    describe=_describe,
)
