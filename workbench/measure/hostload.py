"""How busy the host was with *other* work while we measured.

Whole-machine busy CPU time (psutil) minus our own process's and its reaped children's
(`os.times`: a worker that has ended and been waited for counts, with the DataLoader
workers it waited for) and the CPU time `os.times` cannot see: forked workers, reaped by the
fork server, which reports it (`count_unseen_cpu`). All over the wall time. On a 2-core box a background compile or test
run shows as ~1 core, which is what makes a process-level figure drift.
"""

from __future__ import annotations

import os
import time

_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
_unseen_cpu_s = 0.0


def count_unseen_cpu(seconds: float) -> None:
    """Add CPU seconds our processes spent that `os.times()` does not include (negative once it does)."""
    global _unseen_cpu_s
    _unseen_cpu_s += seconds


class HostLoad:
    """`start()`, measure, end every worker, then `other_cores()`."""

    def __init__(self) -> None:
        self._begin: tuple[float, float, float] | None = None

    def start(self) -> HostLoad:
        self._begin = (time.monotonic(), _machine_busy_s(), _own_cpu_s())
        return self

    def other_cores(self) -> float | None:
        """Average cores other processes kept busy since `start()`; None if unknown or too short.

        Call it after the workers ended and were joined: a live worker's CPU time is not yet
        in `os.times()`, and would count as "other"."""
        if self._begin is None:
            return None
        began, busy0, own0 = self._begin
        wall = time.monotonic() - began
        if wall < 1.0:
            return None
        other = (_machine_busy_s() - busy0) - (_own_cpu_s() - own0)
        return max(0.0, other / wall)


def _machine_busy_s() -> float:
    import psutil

    times = psutil.cpu_times()
    return float(sum(getattr(times, name, 0.0) for name in _BUSY_FIELDS))


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _unseen_cpu_s


class HostCpu:
    """The host's busy cores and this process's own since it was made (a watched job's writer asks
    at every flush): whether other work took cores the job's ranks needed."""

    def __init__(self) -> None:
        self._begin = (time.monotonic(), _machine_busy_s(), _process_cpu_s())

    def figures(self) -> dict[str, float] | None:
        """{busy_cores, own_cores, cores}, averaged since the start; None within its first second."""
        import psutil

        began, busy0, own0 = self._begin
        wall = time.monotonic() - began
        if wall < 1.0:
            return None
        return {
            "busy_cores": max(0.0, _machine_busy_s() - busy0) / wall,
            "own_cores": max(0.0, _process_cpu_s() - own0) / wall,
            "cores": float(psutil.cpu_count() or 1),
        }


def _process_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class ArmMeter:
    """The host's load during one arm of a paired round, measured inside the worker that times it.

    Why per arm: a comparison-wide average cannot tell a load that hit both arms of a round
    alike (cancelled by the pairing) from one that began or ended between them (a biased
    round). Two figures, each cheap (/proc reads, no thread): other processes' busy cores
    (the host's busy CPU minus this process's, all its threads) and our threads' run-queue
    delay per wall second (how long they waited for a core: the direct cost of that load)."""

    def __init__(self) -> None:
        self._begin = (time.monotonic(), _machine_busy_s(), _process_cpu_s(), _threads_waited_s())

    def finish(self) -> tuple[float | None, float | None]:
        """(other processes' cores, our threads' waited seconds per second) since the meter was made."""
        began, busy0, own0, waited0 = self._begin
        wall = time.monotonic() - began
        if wall <= 0.0:
            return None, None
        other = max(0.0, (_machine_busy_s() - busy0) - (_process_cpu_s() - own0)) / wall
        waited = _threads_waited_s()
        wait = None if waited is None or waited0 is None else max(0.0, waited - waited0) / wall
        return other, wait


def _threads_waited_s() -> float | None:
    """Run-queue delay of every thread of this process so far, in seconds (Linux schedstat's second
    field, ns); None where the kernel does not keep it. All threads, not only the caller: a step's
    intra-op threads wait for cores too, and a step ends only when the slowest of them does."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    total, seen = 0, False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as file:
                total += int(file.read().split()[1])
                seen = True
        except (OSError, IndexError, ValueError):  # a thread that ended between listing and reading
            continue
    return total / 1e9 if seen else None
