"""End a worker process when the process that launched it ends.

A trial worker or torchrun rank whose launcher was killed (SIGKILL on the CLI, a crashed
kernel) must not keep running: on a GPU it would keep the device memory. The worker watches
the launcher's pid itself (a Linux pidfd, else polling) instead of relying on a pipe alone
(torchrun sits between the launcher and the ranks and hands no pipe down, and a worker busy
building or timing a model does not read its pipe) or on PR_SET_PDEATHSIG (the kernel sends
that when the launcher's *thread* that started the worker ends, which would kill a healthy
worker started from a short-lived thread).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

#: Set by the distributed launcher for its ranks: the pid whose death ends them.
LAUNCHER_PID_ENV = "WORKBENCH_LAUNCHER_PID"
#: How often the fallback (no pidfd) looks whether the launcher still exists.
POLL_S = 0.5


def end_with(pid: int) -> None:
    """From now on, end this process when process `pid` ends (at once if it is already gone).

    When this process sits in a process group of its own making (a worker started in a new
    session, or a rank with its torchrun), the whole group ends: loader workers, sibling
    ranks and torchrun go with it. Otherwise only this process exits.
    """
    try:
        ours = os.getpgid(0) != os.getpgid(pid)
    except ProcessLookupError:
        os._exit(1)  # launched by a process that has already died
    threading.Thread(target=_watch, args=(pid, ours), name="workbench-lifeline", daemon=True).start()


def end_with_launcher_from_env() -> None:
    """`end_with` the pid the launcher put in the environment; nothing when started by hand."""
    value = os.environ.get(LAUNCHER_PID_ENV, "")
    if value.isdigit():
        end_with(int(value))


def _watch(pid: int, whole_group: bool) -> None:
    _wait_for_exit(pid)
    if whole_group:
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _wait_for_exit(pid: int) -> None:
    """Block until `pid` has exited (a zombie counts as exited: its parent may never reap it)."""
    try:
        fd = os.pidfd_open(pid)  # Linux >= 5.3: readable once the process has exited
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()
        return
    while process_exists(pid):
        time.sleep(POLL_S)


def process_exists(pid: int) -> bool:
    """Whether `pid` exists (a zombie does; a process of another user counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
