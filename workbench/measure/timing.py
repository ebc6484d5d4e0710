"""The timing rules, in one place: how a step and its phases are clocked on each device.

CPU: `time.perf_counter` at every boundary (the host *is* the device).
CUDA: an event at every boundary, recorded in stream order; nothing synchronizes
inside the timed window. `poll()` reads the steps the GPU has already finished
(non-blocking `Event.query`), `finish()` synchronizes once at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepTiming:
    step_ms: float
    phase_ms: dict[str, float] = field(default_factory=dict)


def _phases(stamps: list[tuple[str, float]], start: float) -> dict[str, float]:
    """Time between consecutive boundaries, summed per label (a label ends its phase)."""
    phases: dict[str, float] = {}
    previous = start
    for label, stamp in stamps:
        phases[label] = phases.get(label, 0.0) + (stamp - previous)
        previous = stamp
    return phases


class CpuClock:
    """Host wall-clock boundaries; every step is complete as soon as it ends."""

    def __init__(self) -> None:
        self._start = 0.0
        self._stamps: list[tuple[str, float]] = []
        self._done: list[StepTiming] = []

    def begin_step(self) -> None:
        self._stamps = []
        self._start = time.perf_counter()

    def mark(self, label: str) -> None:
        self._stamps.append((label, time.perf_counter()))

    def end_step(self) -> None:
        end = time.perf_counter()
        phases = {k: v * 1000.0 for k, v in _phases(self._stamps, self._start).items()}
        self._done.append(StepTiming((end - self._start) * 1000.0, phases))

    def poll(self) -> list[StepTiming]:
        done, self._done = self._done, []
        return done

    def finish(self) -> list[StepTiming]:
        return self.poll()


class CudaClock:
    """CUDA events at every boundary; read without synchronizing until `finish()`."""

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self._device = device
        self._pending: list[tuple[Any, list[tuple[str, Any]], Any]] = []
        self._current: tuple[Any, list[tuple[str, Any]]] | None = None

    def _event(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(self._torch.cuda.current_stream(self._device))
        return event

    def begin_step(self) -> None:
        self._current = (self._event(), [])

    def mark(self, label: str) -> None:
        assert self._current is not None, "mark() outside a step"
        self._current[1].append((label, self._event()))

    def end_step(self) -> None:
        assert self._current is not None, "end_step() without begin_step()"
        start, marks = self._current
        self._pending.append((start, marks, self._event()))
        self._current = None

    def _resolve(self, start: Any, marks: list[tuple[str, Any]], end: Any) -> StepTiming:
        phases: dict[str, float] = {}
        previous = start
        for label, event in marks:
            phases[label] = phases.get(label, 0.0) + previous.elapsed_time(event)
            previous = event
        return StepTiming(start.elapsed_time(end), phases)

    def poll(self) -> list[StepTiming]:
        done = []
        while self._pending and self._pending[0][2].query():
            done.append(self._resolve(*self._pending.pop(0)))
        return done

    def finish(self) -> list[StepTiming]:
        self._torch.cuda.synchronize(self._device)
        return self.poll()


def make_clock(device: Any) -> CpuClock | CudaClock:
    return CudaClock(device) if device.type == "cuda" else CpuClock()


def synchronize(device: Any) -> None:
    """Wait for the device; a no-op on CPU (and never touches torch.cuda there)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
