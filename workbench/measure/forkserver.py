"""Start trial workers as forks of one pre-imported process instead of fresh interpreters.

A fresh interpreter pays `import torch` and the first optimizer's `torch._dynamo` import —
about 1.7 s of CPU — before its trial builds anything; a comparison starts half a dozen
workers, so on a 2-core machine that was most of a short comparison's wall time. The fork
server is a fresh interpreter started once (per parent and environment) that imports those
modules, runs nothing, and forks a worker per request: the worker starts with the imports
done and everything else as new as a fresh interpreter's (no tensor, allocator or compile
cache was ever touched in the server; the job still arrives through the pipe, so the
caller's `__main__` is never re-run).

Where forking is not known to be safe the workers start as before, as fresh interpreters:
on a CUDA or ROCm build of torch (a process that forks must not have touched the driver,
and we do not assume an import never does), outside Linux, for a worker that needs its own
environment, and with `WORKBENCH_WORKER_START=spawn`.

The server is this module run as `python -m`; its forks are its children, so it reaps them
and reports each one's exit code and CPU time through a pipe per worker (the CPU time goes
into the host-load reading, which otherwise sees only the children this process reaped).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

from workbench.measure.child_entry import run_child
from workbench.measure.child_env import child_environment
from workbench.measure.hostload import count_unseen_cpu
from workbench.measure.lifeline import process_exists

MODULE = "workbench.measure.forkserver"
SWITCH_ENV = "WORKBENCH_WORKER_START"
"""'spawn' starts every worker as a fresh interpreter; anything else lets the fork server start them."""
PRELOAD = ("torch", "torch._dynamo", "workbench.measure.trial")
"""What every trial imports (`torch._dynamo` comes with the first optimizer): imported once, in the server."""
READY_S = 120.0
"""How long the first request waits for the server's imports before workers start as fresh interpreters."""
READ_AT_USE = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTEST_CURRENT_TEST")
"""Environment variables read when they are used, never at import: a server serves any value of
them (each worker gets the caller's). Inductor sets its cache dir's the first time it looks for it,
in the caller too, which would otherwise replace a server started just before; pytest rewrites
PYTEST_CURRENT_TEST for every test phase, which would otherwise start a new server (seconds of
imports) for every test of a suite that runs trials."""
LOST_EXIT_CODE = 1
"""A forked worker's exit code when the server ended before it (so nobody could read the real one)."""

_STATUS = struct.Struct("=idd")  # exit code (negative: the signal), user and system CPU seconds
_MESSAGE_BYTES = 65536


# --- the parent's side -----------------------------------------------------------------


class ForkedProcess:
    """A worker forked by the server, shaped like the `subprocess.Popen` it stands in for
    (`pid`, `poll`, `wait`, `returncode`); it leads a process group of its own, as a worker
    started in a new session does."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd: int | None = status_fd
        self._server_gone = False

    def poll(self) -> int | None:
        if self.returncode is None:
            self._collect(timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._collect(left if not self._server_gone else (0.05 if left is None else min(0.05, left)))
            if self.returncode is not None:
                return self.returncode
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)

    def __del__(self) -> None:
        if self._status_fd is not None:
            os.close(self._status_fd)

    def _collect(self, timeout: float | None) -> None:
        """Read the exit status if the server has written it within `timeout` seconds."""
        if self.returncode is not None:
            return
        if self._server_gone:  # nobody reaps it for us: only whether it still exists can be known
            if not process_exists(self.pid):
                self.returncode = LOST_EXIT_CODE
            elif timeout:
                time.sleep(timeout)
            return
        assert self._status_fd is not None
        if not select.select([self._status_fd], [], [], timeout)[0]:
            return
        data = os.read(self._status_fd, _STATUS.size)
        os.close(self._status_fd)
        self._status_fd = None
        if len(data) == _STATUS.size:
            code, user_s, system_s = _STATUS.unpack(data)
            count_unseen_cpu(user_s + system_s)
            self.returncode = code
        else:
            self._server_gone = True
            self._collect(0.0)


class _Server:
    """One fork server and the environment it was started with; `ready()` waits for its imports."""

    def __init__(self, env: dict[str, str]) -> None:
        self.key = _key(env)
        self.why_not: str | None = None
        self.answered = False
        self.startup_cpu_s = 0.0
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", MODULE, str(theirs.fileno()), str(os.getpid()), *PRELOAD]
        try:
            self.process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=env, start_new_session=True)
        finally:
            theirs.close()
        self.socket = ours

    def ready(self) -> bool:
        """Whether it forks workers, once it has said so (it refuses on a GPU build of torch)."""
        if not self.answered:
            self.answered = True
            reply = self._receive(READY_S)
            if reply is None or not reply.get("ready"):
                self.why_not = (reply or {}).get("why", "the fork server did not start in time")
                self.stop()
            else:  # ours, and unseen by `os.times()` until we reap the server
                self.startup_cpu_s = float(reply["cpu_s"])
                count_unseen_cpu(self.startup_cpu_s)
        return self.why_not is None

    @property
    def refused(self) -> bool:
        return self.answered and self.why_not is not None

    def fork(self, request_fd: int, reply_fd: int, spare: bool, env: dict[str, str]) -> ForkedProcess:
        status_read, status_write = os.pipe()
        try:
            stdio = [fd for fd in (0, 1, 2) if _is_open(fd)]  # the worker's stdio is ours now, as a spawn's
            at_use = {name: env.get(name) for name in READ_AT_USE}
            message = json.dumps({"cwd": os.getcwd(), "spare": spare, "stdio": stdio, "env": at_use}).encode()
            socket.send_fds(self.socket, [message], [request_fd, reply_fd, status_write, *stdio])
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        reply = self._receive(READY_S)
        if reply is None or "pid" not in reply:
            os.close(status_read)
            raise OSError(f"the fork server did not fork a worker: {(reply or {}).get('why', 'no answer')}")
        return ForkedProcess(int(reply["pid"]), status_read)

    def running(self) -> bool:
        return not self.refused and self.process.poll() is None

    def stop(self) -> None:
        """Close the socket (a ready server exits on it; one still importing is killed) and reap it;
        its workers live on."""
        self.socket.close()
        if not self.answered or self.refused:
            self.process.kill()
        try:
            self.process.wait(2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(2)
        count_unseen_cpu(-self.startup_cpu_s)  # reaped: `os.times()` has it now
        self.startup_cpu_s = 0.0

    def _receive(self, timeout: float) -> dict[str, Any] | None:
        if not select.select([self.socket], [], [], timeout)[0]:
            return None
        data = self.socket.recv(_MESSAGE_BYTES)
        return json.loads(data) if data else None


_lock = threading.Lock()
_server: _Server | None = None


def fork_worker(request_fd: int, reply_fd: int, spare: bool = False) -> ForkedProcess | None:
    """A worker forked from the server for the caller's current environment, holding copies
    of the two pipe ends; None where workers must start as fresh interpreters (see above)."""
    global _server
    if not _may_fork():
        return None
    env = child_environment()
    with _lock:
        server = _server_for(env)
        if server is None:
            return None
        try:
            return server.fork(request_fd, reply_fd, spare, env)
        except OSError:
            server.stop()
            _server = None
            return None


def start_server() -> None:
    """Start the server now without waiting for it, so its imports overlap the caller's own (a
    command about to run trials); the first worker waits for it, if it must."""
    if _may_fork():
        with _lock:
            _server_for(child_environment(), wait=False)


def _server_for(env: dict[str, str], wait: bool = True) -> _Server | None:
    """The server for `env` (started, or replacing one for another environment); None where it
    refused to fork. Called holding `_lock`."""
    global _server
    if _server is None or _server.key != _key(env) or not (_server.refused or _server.running()):
        if _server is not None and not _server.refused:
            _server.stop()
        _server = _Server(env)
    if not wait:
        return _server
    return _server if _server.ready() else None


def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, value) for name, value in env.items() if name not in READ_AT_USE))


def _may_fork() -> bool:
    return os.environ.get(SWITCH_ENV, "").strip().lower() != "spawn" and sys.platform == "linux" and not _gpu_build()


def server_pid() -> int | None:
    """The running fork server's pid (it is idle between trials and ends with this process)."""
    return _server.process.pid if _server is not None and _server.running() else None


def stop_server() -> None:
    global _server
    with _lock:
        if _server is not None and not _server.refused:
            _server.stop()
        _server = None


atexit.register(stop_server)


def _gpu_build() -> bool:
    """Whether our own torch (when imported) is a CUDA or ROCm build: the server would say so too,
    after seconds of imports."""
    torch = sys.modules.get("torch")
    return torch is not None and (torch.version.cuda is not None or torch.version.hip is not None)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# --- the server's side -------------------------------------------------------------------


def _serve(sock: socket.socket, parent_pid: int, preload: list[str]) -> None:
    """Import, then fork a worker per request until the parent closes its end (or dies)."""
    import importlib

    why_not = None
    try:
        for name in preload:
            importlib.import_module(name)
        if _gpu_build():
            why_not = "a GPU build of torch: workers start as fresh interpreters, never forked"
        elif threading.active_count() > 1:
            why_not = f"{threading.active_count()} threads after the imports: forking is not safe"
    except Exception as exc:
        why_not = f"the fork server's imports failed: {type(exc).__name__}: {exc}"
    sock.send(json.dumps({"ready": why_not is None, "why": why_not, "cpu_s": time.process_time()}).encode())
    if why_not is not None:
        return

    statuses: dict[int, int] = {}  # worker pid -> the write end of its status pipe
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    try:
        while os.getppid() == parent_pid:  # else the parent died without closing its end (a fork of it may hold it)
            ready = select.select([sock.fileno(), wake_read], [], [], 1.0)[0]
            if wake_read in ready:
                os.read(wake_read, 4096)
            _reap(statuses)
            if sock.fileno() in ready and not _fork_one(sock, parent_pid, statuses, [wake_read, wake_write]):
                return
    except OSError:
        return  # the parent's end is gone mid-reply


def _fork_one(sock: socket.socket, parent_pid: int, statuses: dict[int, int], own_fds: list[int]) -> bool:
    """Fork a worker for the request waiting on `sock`; False once the parent has closed its end."""
    message, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 8)
    if not message:
        return False
    request = json.loads(message)
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"why": f"fork failed: {exc}"}).encode())
        return True
    if pid == 0:
        os._exit(_become_worker(request, fds, parent_pid, [sock.fileno(), *own_fds, *statuses.values()]))
    try:
        os.setpgid(pid, pid)  # the worker does it too: whichever runs first, its group exists before we answer
    except OSError:
        pass  # it has done it, or already ended
    statuses[pid] = fds[2]
    for fd in (fds[0], fds[1], *fds[3:]):
        os.close(fd)
    sock.send(json.dumps({"pid": pid}).encode())
    return True


def _reap(statuses: dict[int, int]) -> None:
    while statuses:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is None:
            continue
        try:
            os.write(fd, _STATUS.pack(os.waitstatus_to_exitcode(status), usage.ru_utime, usage.ru_stime))
        except OSError:
            pass  # the parent no longer listens
        os.close(fd)


def _become_worker(request: dict[str, Any], fds: list[int], parent_pid: int, server_fds: list[int]) -> int:
    """In the fork: leave the server's state behind, then run the job as `python -m` would."""
    try:
        os.setpgid(0, 0)  # a group of its own, so stopping it ends its loader workers and nothing else
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (*server_fds, fds[2]):
            os.close(fd)
        for target, fd in zip(request["stdio"], fds[3:]):
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)
        os.chdir(request["cwd"])
        for name, value in request["env"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reseed()
        run_child(fds[0], fds[1], parent_pid, spare=bool(request["spare"]))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    # An interpreter that ends normally runs its exit handlers and flushes its streams; `os._exit`
    # (the only safe way out of a fork) would skip both.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _reseed() -> None:
    """Give the fork the random state of a fresh interpreter: torch and numpy seed their global
    generators from the OS at start-up, and every fork would otherwise share the server's
    (Python's `random` reseeds itself after a fork)."""
    import torch

    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2]), sys.argv[3:])
