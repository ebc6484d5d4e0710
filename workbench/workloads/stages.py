"""Stage markers for a sample's preparation: `with stage("decode"): ...` inside `__getitem__`.

Off (the default) a marker is one global read, so a Dataset can keep them for good; while a
`StageTimes` collects (in the loader worker that prepares the sample), each stage's seconds add up.
A stage nobody marked is absent from the record, never a 0: "not measured" is its own answer.
`TimedSamples` and `TimedCollate` carry the times out of the loader workers with the batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_collecting: StageTimes | None = None


class StageTimes:
    """Milliseconds per stage name, summed over the markers entered while this collects."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.ms[name] = self.ms.get(name, 0.0) + seconds * 1000.0

    @contextmanager
    def collecting(self) -> Iterator[StageTimes]:
        """Markers entered inside the block add to this record (the previous collector is restored)."""
        global _collecting
        previous, _collecting = _collecting, self
        try:
            yield self
        finally:
            _collecting = previous


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark a part of a sample's preparation (read, decode, transform, ...) for the stage breakdown."""
    collector = _collecting
    if collector is None:
        yield
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        collector.add(name, time.perf_counter() - began)


def collect_from_now() -> StageTimes:
    """Collect every marker entered from now on in this process: a loader worker of a watched job
    collects for its whole life, and its collate takes each batch's share (`take_collected`)."""
    global _collecting
    _collecting = StageTimes()
    return _collecting


def take_collected() -> dict[str, float]:
    """Milliseconds per stage collected in this process since the last take, the record starting
    afresh; {} where nothing collects."""
    collector = _collecting
    if collector is None:
        return {}
    taken, collector.ms = collector.ms, {}
    return taken


class TimedSamples:
    """A dataset whose items come with their stage times: `(sample, {stage: ms}, worker, began, ended)`.

    Wrapped around a workload's dataset when a trial asks where a sample's time goes; the times
    are taken where the sample is made (a loader worker, or the training process without
    workers), on `time.perf_counter`, the system-wide monotonic clock on Linux, so a worker's
    stamps and the training loop's compare."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: Any) -> tuple[Any, dict[str, float], int, float, float]:
        times = StageTimes()
        began = time.perf_counter()
        with times.collecting():
            sample = self.inner[index]
        return sample, times.ms, _worker_id(), began, time.perf_counter()


class TimedCollate:
    """Collates `TimedSamples` items: `(batch, BatchStages)`, the collate itself timed as a stage."""

    def __init__(self, inner: Callable[[list[Any]], Any] | None) -> None:
        self.inner = inner

    def __call__(self, items: list[tuple[Any, dict[str, float], int, float, float]]) -> tuple[Any, BatchStages]:
        from torch.utils.data import default_collate

        began = time.perf_counter()
        batch = (self.inner or default_collate)([item[0] for item in items])
        ended = time.perf_counter()
        record = BatchStages(
            samples=[item[1] for item in items],
            collate_ms=(ended - began) * 1000.0,
            worker=_worker_id(),
            began=min((item[3] for item in items), default=began),
            ended=ended,
        )
        return batch, record


@dataclass
class BatchStages:
    """One batch's preparation: each sample's stage times, the collate, who made it and when."""

    samples: list[dict[str, float]]
    collate_ms: float
    worker: int
    """The loader worker's id; -1 for the training process itself (num_workers=0)."""
    began: float
    ended: float
    """perf_counter stamps of the batch's first sample started and its collate finished."""


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return info.id if info is not None else -1
