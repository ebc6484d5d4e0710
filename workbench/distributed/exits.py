"""When each rank's process ended, as the launcher sees it.

The launcher is not the ranks' parent (torchrun is), so it cannot learn their exit status;
torchrun's record gives that. What the launcher can learn is *when* a rank died, which a rank
killed by a signal cannot report itself: a Linux pidfd becomes readable the moment the process
exits, so the follower's wait wakes then and stamps the time. Without pidfds (older kernels,
other systems) the processes are polled instead, at the follower's pace.
"""

from __future__ import annotations

import os
import select
import time

import psutil


class ExitWatch:
    """`add(rank, pid)` each rank as it reports in; `wait(seconds)` sleeps, waking when one ends;
    `ended` maps rank -> time.time() at which its process was seen gone."""

    def __init__(self) -> None:
        self.ended: dict[int, float] = {}
        self._poller = select.poll()
        self._by_fd: dict[int, int] = {}
        self._polled: dict[int, psutil.Process] = {}

    def add(self, rank: int, pid: int) -> None:
        if rank in self.ended or rank in self._by_fd.values() or rank in self._polled:
            return
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.ended[rank] = time.time()
            return
        except (AttributeError, OSError):
            try:
                self._polled[rank] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                self.ended[rank] = time.time()
            return
        self._by_fd[fd] = rank
        self._poller.register(fd, select.POLLIN)

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, returning early when a watched process ends."""
        for fd, _ in self._poller.poll(seconds * 1000.0 if self._by_fd else 0):
            self._end(fd)
        if not self._by_fd and seconds > 0:
            time.sleep(seconds)
        for rank, process in list(self._polled.items()):
            if not _running(process):
                self.ended[rank] = time.time()
                del self._polled[rank]

    def close(self) -> None:
        for fd in list(self._by_fd):
            self._poller.unregister(fd)
            os.close(fd)
        self._by_fd.clear()

    def _end(self, fd: int) -> None:
        rank = self._by_fd.pop(fd)
        self.ended[rank] = time.time()
        self._poller.unregister(fd)
        os.close(fd)


def _running(process: psutil.Process) -> bool:
    """A zombie has exited: only torchrun's reaping is missing."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
