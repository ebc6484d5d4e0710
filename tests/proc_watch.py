"""Start the CLI as a user would and watch the processes it leaves behind (for the kill tests)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from workbench.measure import forkserver

WORKER_COMMAND = "workbench.measure."
"""In a worker's command line, forked (`measure.forkserver`) or a fresh interpreter (`measure.child`)."""


def start_cli_and_wait_for_steps(args: list[str]) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """`workbench <args>` in a subprocess, returned once its progress line shows a step, with its descendants."""
    cli = subprocess.Popen([sys.executable, "-m", "workbench.cli", *args], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)  # fmt: skip
    seen = b""
    assert cli.stderr is not None
    while b"warm-up" not in seen and b"timed" not in seen:
        chunk = cli.stderr.read1(4096)
        assert chunk, seen.decode(errors="replace")  # the CLI ended before any step
        seen += chunk
    return cli, psutil.Process(cli.pid).children(recursive=True)


def still_running_after(processes: list[psutil.Process], within_s: float) -> list[psutil.Process]:
    """The processes still running after `within_s` (a zombie has ended: only its reaper is missing)."""
    deadline = time.monotonic() + within_s
    alive = processes
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _running(p)]
    return alive


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def no_live_children(within_s: float = 5.0) -> bool:
    """True once no descendant of this process is still running, but for the two that live as long as
    we do: multiprocessing's resource tracker and the idle fork server (its forked workers do count)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = []
        for child in psutil.Process().children(recursive=True):
            try:
                if (_running(child) and "resource_tracker" not in " ".join(child.cmdline())
                        and child.pid != forkserver.server_pid()):  # fmt: skip
                    alive.append(child)
            except psutil.NoSuchProcess:
                continue
        if not alive:
            return True
        time.sleep(0.2)
    return False
