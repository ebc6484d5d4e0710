"""Where a thread's time went: on a core, waiting for one, or neither (asleep, blocked on I/O or a lock).

A rank that is late because other work took its core waited on the run queue; one that computed
longer (more work, or a core slowed by a busy hyperthread sibling) was on a core longer; one that
slept or waited for a disk, the network or a loader worker was on neither. Linux keeps the first
two per thread in /proc/.../schedstat (on-CPU ns, run-queue ns); reading it costs a few µs and
never blocks. Elsewhere (or with schedstats off) the figures are None: not measured.
"""

from __future__ import annotations


def thread_times(tid: int | None = None) -> tuple[float, float] | None:
    """(seconds on a core, seconds runnable without one) of thread `tid` (default: the calling thread)."""
    path = f"/proc/self/task/{tid}/schedstat" if tid is not None else "/proc/thread-self/schedstat"
    try:
        with open(path, "rb") as file:
            fields = file.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def step_deltas(before: tuple[float, float] | None, after: tuple[float, float] | None) -> tuple[float | None, ...]:
    """(ms on a core, ms waiting for one) between two readings; Nones where either is missing."""
    if before is None or after is None:
        return None, None
    return (after[0] - before[0]) * 1000.0, (after[1] - before[1]) * 1000.0


class ThreadSteps:
    """Per step, the calling thread's ms on a core and ms waiting for one: `step_ended()` at each step's end."""

    def __init__(self) -> None:
        self._last = thread_times()
        self.cpu_ms: list[float | None] = []
        self.cpu_wait_ms: list[float | None] = []

    def step_ended(self) -> None:
        now = thread_times()
        on_core, waiting = step_deltas(self._last, now)
        self.cpu_ms.append(on_core)
        self.cpu_wait_ms.append(waiting)
        self._last = now
