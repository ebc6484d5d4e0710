"""Stage markers for a sample's preparation: `with stage("decode"): ...` inside `__getitem__`.

Off (the default) a marker is one global read, so a Dataset can keep them for good; while a
`StageTimes` collects (in the loader worker that prepares the sample), each stage's seconds add up.
A stage nobody marked is absent from the record, never a 0: "not measured" is its own answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

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
