"""A watched job's steps kept in bounded memory: the whole run downsampled, the recent window in full.

The run is a list of buckets of `stride` consecutive steps (their sums, so merging is
exact); when it reaches `max_rows` buckets, neighbours merge and the stride doubles, so
a run of any length holds at most `max_rows` buckets plus `recent` single steps. Only
the writer thread touches this; the training loop never does.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from workbench.store.watched import STEP_FIELDS, StepRow

#: Fields averaged over a bucket (peak memory takes the maximum, wall time the last).
_MEANS = tuple(f for f in STEP_FIELDS if f not in ("wall_time", "peak_memory_bytes"))


@dataclass
class _Bucket:
    first_step: int
    steps: int = 0
    wall_time: float = 0.0
    peak_memory_bytes: int | None = None
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    stage_sums: dict[str, float] = field(default_factory=dict)
    stage_counts: dict[str, int] = field(default_factory=dict)
    """Per marked stage: its ms summed over the steps that measured it, and how many did."""

    def add(self, s: StepRow) -> None:
        """One measured step (a row of `steps=1`)."""
        self.steps += 1
        self.wall_time = s.wall_time
        if s.peak_memory_bytes is not None:
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, s.peak_memory_bytes)
        for name in _MEANS:
            value = getattr(s, name)
            if value is not None:
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1
        for name, ms in (s.stages or {}).items():
            self.stage_sums[name] = self.stage_sums.get(name, 0.0) + ms
            self.stage_counts[name] = self.stage_counts.get(name, 0) + 1

    def merge(self, later: _Bucket) -> None:
        self.steps += later.steps
        self.wall_time = later.wall_time
        if later.peak_memory_bytes is not None:
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, later.peak_memory_bytes)
        for name, total in later.sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + total
            self.counts[name] = self.counts.get(name, 0) + later.counts[name]
        for name, total in later.stage_sums.items():
            self.stage_sums[name] = self.stage_sums.get(name, 0.0) + total
            self.stage_counts[name] = self.stage_counts.get(name, 0) + later.stage_counts[name]

    def row(self) -> StepRow:
        means = {n: self.sums[n] / self.counts[n] for n in self.sums if self.counts.get(n)}
        stages = {n: total / self.stage_counts[n] for n, total in self.stage_sums.items()} or None
        return StepRow(
            self.first_step,
            self.steps,
            self.wall_time,
            peak_memory_bytes=self.peak_memory_bytes,
            stages=stages,
            **means,
        )


class StepHistory:
    """Downsampled history plus the recent window; `changes()` says what to write since last asked."""

    def __init__(self, max_rows: int = 1024, recent: int = 512) -> None:
        if max_rows < 2 or max_rows % 2:
            raise ValueError(f"max_rows must be an even number >= 2, got {max_rows}")
        self.max_rows = max_rows
        self.stride = 1
        self.buckets: list[_Bucket] = []
        self.recent: collections.deque[StepRow] = collections.deque(maxlen=max(1, recent))
        self.last_step = 0
        self._written = 0  # buckets before this index are stored complete
        self._replaced = False
        self._recent_written = 0  # last step of the recent window already stored

    def add(self, s: StepRow) -> None:
        """One measured step: a row of one step (`first_step` is its number)."""
        self.last_step = s.first_step
        self.recent.append(s)
        if not self.buckets or self.buckets[-1].steps >= self.stride:
            if len(self.buckets) >= self.max_rows:
                self._halve()
            self.buckets.append(_Bucket(first_step=s.first_step))
        self.buckets[-1].add(s)

    def rows(self) -> list[StepRow]:
        return [b.row() for b in self.buckets]

    def changes(self) -> tuple[list[StepRow], bool, list[StepRow], int]:
        """(history rows to write, whether they replace all stored ones, recent rows to write, first recent step)."""
        start = 0 if self._replaced else self._written
        history = [b.row() for b in self.buckets[start:]]
        replaced, self._replaced = self._replaced, False
        # The last bucket may still grow: it is written again until it is complete.
        self._written = max(0, len(self.buckets) - 1)
        recent = [s for s in self.recent if s.first_step > self._recent_written]
        self._recent_written = self.last_step
        first_recent = self.recent[0].first_step if self.recent else 0
        return history, replaced, recent, first_recent

    def changes_lost(self) -> None:
        """The last `changes()` were not stored: send everything again next time."""
        self._replaced = True
        self._recent_written = 0

    def _halve(self) -> None:
        merged = []
        for i in range(0, len(self.buckets), 2):
            bucket = self.buckets[i]
            if i + 1 < len(self.buckets):
                bucket.merge(self.buckets[i + 1])
            merged.append(bucket)
        self.buckets = merged
        self.stride *= 2
        self._replaced = True
