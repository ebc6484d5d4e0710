"""How long a thread waited for a CPU core while runnable: the kernel's run-queue delay.

A rank that is late because other work took its core waited on the run queue; one that is
late because it slept (a slow disk, a network read) or computed longer did not. Linux keeps
this per thread in /proc/.../schedstat (its second field, in ns); reading it costs a few µs
and never blocks. Elsewhere (or with schedstats off) the figure is None: not measured.
"""

from __future__ import annotations

import threading


def run_queue_s(tid: int | None = None) -> float | None:
    """Seconds the thread `tid` (default: the calling thread) has spent runnable but not running."""
    path = f"/proc/self/task/{tid}/schedstat" if tid is not None else "/proc/thread-self/schedstat"
    try:
        with open(path, "rb") as file:
            return int(file.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class RunQueueSteps:
    """Per step, the calling thread's run-queue delay in ms: `step_ended()` once at each step's end."""

    def __init__(self) -> None:
        self.tid = threading.get_native_id()
        self._last = run_queue_s()
        self.per_step_ms: list[float | None] = []

    def step_ended(self) -> None:
        now = run_queue_s()
        seen = None if now is None or self._last is None else (now - self._last) * 1000.0
        self.per_step_ms.append(seen)
        self._last = now
