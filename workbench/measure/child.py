"""Worker processes: forks of a pre-imported server (`forkserver`) or fresh interpreters running
`python -m workbench.measure.child`, never started through multiprocessing.

multiprocessing's spawn re-runs the caller's `__main__` in the child, so a plain script that
calls `run_trial` without an `if __name__ == "__main__":` guard fails in the child (and a
script with side effects runs them twice). A fresh interpreter running this module imports
only the workbench; the job — a module-level function and its arguments — arrives
cloudpickled through a pipe, and messages go back through another
(`multiprocessing.connection.Connection` over raw pipe ends, so `send`/`recv`/`poll` work
as with `Pipe()`). The child runs in its own session: ending its process group ends the
DataLoader workers it started too; and it ends that group itself when its parent dies
(`lifeline`), whatever job it runs.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from workbench.measure.child_entry import run_child
from workbench.measure.child_env import child_environment
from workbench.measure.forkserver import ForkedProcess, fork_worker

MODULE = "workbench.measure.child"
SPARE_FLAG = "--spare"
SPARE_READY_S = 120.0
"""How long `prestart` waits for a spare's imports before giving up on it (it is then stopped)."""


class ChildProcess:
    """A running child: `inbox` (child → parent), `outbox` (parent → child), and process control
    shaped like `multiprocessing.Process` (`is_alive`, `exitcode`, `join`, `stop`)."""

    def __init__(self, job: Callable[..., None], *args: Any, memory_limit_bytes: int | None = None,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        import cloudpickle

        spare = _take_spare() if env is None else None
        if spare is not None:  # already started and imported, idle until now
            self.process, self.outbox, self.inbox = spare.process, spare.outbox, spare.inbox
        else:
            self.process, self.outbox, self.inbox = _spawn(env)
        self.outbox.send_bytes(cloudpickle.dumps((job, args, memory_limit_bytes)))

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_alive(self) -> bool:
        return self.process.poll() is None

    @property
    def exitcode(self) -> int | None:
        """Like `multiprocessing.Process.exitcode`: negative for a signal."""
        return self.process.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        """End the child and its process group (loader workers too): terminate, then kill."""
        if self.is_alive():
            _signal_group(self.process.pid, signal.SIGTERM)
            self.join(0.5)
        if self.is_alive():
            _signal_group(self.process.pid, signal.SIGKILL)
        self.join(2)
        _signal_group(self.process.pid, signal.SIGKILL)  # stragglers of the group, if any remain
        for end in (self.outbox, self.inbox):
            end.close()


class _Spare:
    """A child started ahead of its job: imported, blocked reading the job, using no CPU."""

    def __init__(self) -> None:
        self.process, self.outbox, self.inbox = _spawn(None, spare=True)

    def stop(self) -> None:
        _signal_group(self.process.pid, signal.SIGKILL)
        try:
            self.process.wait(2)
        except subprocess.TimeoutExpired:
            pass
        for end in (self.outbox, self.inbox):
            end.close()


Worker = subprocess.Popen[bytes] | ForkedProcess

_spares: list[_Spare] = []
_spares_lock = threading.Lock()


def prestart(count: int) -> int:
    """Start `count` workers now and wait until each has imported torch and the workbench.

    Why: a worker's start-up (interpreter, `import torch`, the workbench) takes seconds; spares
    started together share the CPUs while nothing is measured, so a comparison pays that once,
    not once per trial. They wait, idle, for their job; `ChildProcess` takes one before starting
    a new process. Returns how many are ready; `discard_spares` ends the unused ones."""
    started = [_Spare() for _ in range(max(0, count))]
    deadline = time.monotonic() + SPARE_READY_S
    ready = []
    for spare in started:
        try:
            if spare.inbox.poll(max(0.0, deadline - time.monotonic())) and spare.inbox.recv() == ("imported",):
                ready.append(spare)
                continue
        except (EOFError, OSError):
            pass
        spare.stop()
    with _spares_lock:
        _spares.extend(ready)
    return len(ready)


def discard_spares() -> None:
    """End the spares nobody took (they hold memory, and on a GPU host they must not linger)."""
    with _spares_lock:
        unused = list(_spares)
        _spares.clear()
    for spare in unused:
        spare.stop()


atexit.register(discard_spares)


def _take_spare() -> _Spare | None:
    with _spares_lock:
        while _spares:
            spare = _spares.pop(0)
            if spare.process.poll() is None:
                return spare
            spare.stop()
    return None


def _spawn(env: dict[str, str] | None, spare: bool = False) -> tuple[Worker, Connection, Connection]:
    """A worker holding the other ends of two new pipes: forked from the pre-imported server for the
    caller's own environment (`env` None) where that is safe (`forkserver`), else a fresh interpreter."""
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    command = [sys.executable, "-m", MODULE, str(request_read), str(reply_write), str(os.getpid()),
               *([SPARE_FLAG] if spare else [])]  # fmt: skip
    try:
        process: Worker | None = fork_worker(request_read, reply_write, spare) if env is None else None
        if process is None:
            process = subprocess.Popen(command, pass_fds=(request_read, reply_write), env=env or child_environment(),
                                       start_new_session=True)  # fmt: skip
    finally:
        os.close(request_read)  # the child holds its own copies; EOF then means "the other side is gone"
        os.close(reply_write)
    return process, Connection(request_write, readable=False), Connection(reply_read, writable=False)


def watch_parent(outbox_from_parent: Connection) -> None:
    """Exit when the parent goes away (its end of the request pipe closes), for jobs that do not
    read commands themselves: an orphaned trial must not keep a GPU or the CPUs busy."""

    def wait_for_eof() -> None:
        try:
            while True:
                outbox_from_parent.recv_bytes()
        except (EOFError, OSError):
            os._exit(1)

    threading.Thread(target=wait_for_eof, name="workbench-parent-watch", daemon=True).start()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    run_child(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), spare=SPARE_FLAG in sys.argv[4:])
