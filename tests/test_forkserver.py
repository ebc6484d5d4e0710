"""Workers forked from the pre-imported server behave as fresh interpreters did: their own process
group, the caller's cwd, stdio and environment, a fresh interpreter's torch state, exit codes and
CPU time that reach the caller; and a worker outlives a server that dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from proc_watch import no_live_children

from workbench.measure import forkserver
from workbench.measure.child import ChildProcess
from workbench.measure.hostload import _own_cpu_s as own_cpu_s

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server runs on Linux only")


@pytest.fixture(autouse=True)
def _forking(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(forkserver.SWITCH_ENV, raising=False)
    yield
    assert no_live_children()


def report_process(requests: Any, replies: Any) -> None:
    import torch

    replies.send({"pid": os.getpid(), "pgid": os.getpgid(0), "ppid": os.getppid(), "cwd": os.getcwd(),
                  "seed": torch.initial_seed(), "threads": torch.get_num_threads(),
                  "marker": os.environ.get("WORKBENCH_TEST_MARKER")})  # fmt: skip


def exit_with(requests: Any, replies: Any, code: int) -> None:
    sys.exit(code)


def raise_error(requests: Any, replies: Any) -> None:
    raise RuntimeError("the job broke")


def say_hello(requests: Any, replies: Any) -> None:
    print("hello from the worker", flush=True)


def burn_cpu(requests: Any, replies: Any, seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    replies.send(time.process_time())


def wait_forever(requests: Any, replies: Any) -> None:
    replies.send("waiting")
    time.sleep(600)


def run(job: Any, *args: Any) -> tuple[Any, ChildProcess]:
    child = ChildProcess(job, *args)
    try:
        reply = child.inbox.recv() if child.inbox.poll(60) else None
    except EOFError:  # it ended without a reply
        reply = None
    child.join(30)
    return reply, child


def fresh_interpreter(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_a_forked_worker_is_the_servers_child_in_its_own_group_with_a_fresh_interpreters_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    reply, child = run(report_process)
    assert child.exitcode == 0
    assert reply["ppid"] == forkserver.server_pid() and reply["ppid"] != os.getpid()
    assert reply["pgid"] == reply["pid"]  # stopping it ends its group (its loader workers), not the server
    assert reply["cwd"] == str(tmp_path)
    # The server imported torch and never ran it: the worker's thread pool is a fresh process's, and
    # its generator is seeded from the OS as a fresh process's is (not a copy of the server's).
    assert reply["threads"] == int(fresh_interpreter("import torch; print(torch.get_num_threads())"))
    assert run(report_process)[0]["seed"] != reply["seed"]


def test_exit_codes_and_a_jobs_traceback_reach_the_caller(capfd: pytest.CaptureFixture[str]) -> None:
    assert run(exit_with, 3)[1].exitcode == 3
    assert run(exit_with, 0)[1].exitcode == 0
    assert run(raise_error)[1].exitcode == 1
    assert "RuntimeError: the job broke" in capfd.readouterr().err  # on the caller's stderr, as a spawn's
    run(say_hello)
    assert "hello from the worker" in capfd.readouterr().out

    child = ChildProcess(wait_forever)
    assert child.inbox.recv() == "waiting"
    child.stop()
    assert child.exitcode == -signal.SIGTERM


def test_a_changed_environment_gets_a_new_server_and_the_switch_gets_fresh_interpreters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run(report_process)
    first = forkserver.server_pid()
    monkeypatch.setenv("WORKBENCH_TEST_MARKER", "seen")
    reply, _ = run(report_process)
    assert reply["marker"] == "seen" and reply["ppid"] == forkserver.server_pid() != first
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE

    monkeypatch.setenv(forkserver.SWITCH_ENV, "spawn")
    reply, _ = run(report_process)
    assert reply["ppid"] == os.getpid()  # a fresh interpreter started by us


def test_a_forked_workers_cpu_time_is_ours_in_the_host_load() -> None:
    """The server, not we, reaps a forked worker, so `os.times()` never sees its CPU time; the
    host-load reading must still count it as ours, or every comparison would report its own
    workers as another process keeping the host busy."""
    run(report_process)  # the server is up before the reading starts
    before = own_cpu_s()
    burned, child = run(burn_cpu, 1.0)  # the worker's own count of its CPU seconds
    assert child.exitcode == 0
    assert own_cpu_s() - before >= burned * 0.95


def test_a_worker_outlives_its_server_and_the_next_one_starts_a_new_server() -> None:
    child = ChildProcess(wait_forever)
    assert child.inbox.recv() == "waiting"
    server = forkserver.server_pid()
    assert server is not None
    os.kill(server, signal.SIGKILL)
    time.sleep(0.3)
    assert child.is_alive()  # its exit status is lost with the server, the worker is not
    child.stop()
    assert child.exitcode == forkserver.LOST_EXIT_CODE
    reply, _ = run(report_process)
    assert reply["ppid"] == forkserver.server_pid() not in (None, server)


def report_variable(requests: Any, replies: Any, name: str) -> None:
    replies.send(os.environ.get(name))


def test_a_server_started_early_serves_the_first_trial_and_passes_the_compile_cache_dir_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A command starts the server before its own imports; inductor then sets its cache dir in the
    caller's environment the first time it looks, which must not cost a second server."""
    forkserver.stop_server()
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    forkserver.start_server()
    early = forkserver.server_pid()
    assert early is not None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    reply, child = run(report_variable, "TORCHINDUCTOR_CACHE_DIR")
    assert child.exitcode == 0 and reply == str(tmp_path / "inductor")
    assert forkserver.server_pid() == early


def test_pytests_per_phase_variable_keeps_the_server_and_reaches_each_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest rewrites PYTEST_CURRENT_TEST for every test's setup, call and teardown: a suite that
    runs trials in many tests (a user's regression checks) keeps one server, and each worker still
    sees the value its caller had."""
    run(report_process)
    server = forkserver.server_pid()
    for phase in ("test_a (setup)", "test_a (call)", "test_b (call)"):
        monkeypatch.setenv("PYTEST_CURRENT_TEST", phase)
        reply, child = run(report_variable, "PYTEST_CURRENT_TEST")
        assert child.exitcode == 0 and reply == phase
    assert forkserver.server_pid() == server
