"""A distributed trial names the rank that failed first, whichever way it died.

Each case starts a real 2-rank gloo torchrun job whose rank 1 misbehaves in its third forward
(raises, hangs, calls os._exit(7), segfaults, or is killed with SIGKILL from here). Before it
misbehaves, rank 1 writes its pid and the time to a file: the independent truth the trial's
record is checked against. Then the stored run must give back the same per-rank records.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import resource
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from proc_watch import no_live_children
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from workbench.api import run_and_store
from workbench.config import TrainConfig
from workbench.distributed.agent import failure_record
from workbench.distributed.failures import (
    RankFailure,
    assemble_failures,
    consequence_of,
    describe_exit,
    explain_failures,
    first_failure,
)
from workbench.store import Store

TIMEOUT_S = 20
"""Long enough for torchrun to stop every rank after one fails, on a slow host: those cases must end sooner."""
HANG_TIMEOUT_S = 8
"""The hang case waits this out: the trial's clock starts after start-up, so ranks are already stepping."""
BAD_RANK = 1


class Misbehave(nn.Module):
    """Healthy, except on rank 1 from its third forward: it notes its pid and the time, then `mode`."""

    def __init__(self, mode: str, report: str) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.mode, self.report, self.calls = mode, report, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if dist.is_initialized() and dist.get_rank() == BAD_RANK and self.calls > 2:
            _note(self.report)
            if self.mode == "raise":
                raise ValueError(f"bad sample on rank {BAD_RANK}")
            if self.mode == "exit":
                os._exit(7)
            if self.mode == "segfault":
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file to write
                ctypes.string_at(0)  # reads address 0: a real segmentation fault
            time.sleep(600)  # hang, or wait here for the test's SIGKILL
        return self.linear(x)


def _note(path: str) -> None:
    partial = f"{path}.partial"
    Path(partial).write_text(json.dumps({"pid": os.getpid(), "time": time.time()}))
    os.replace(partial, path)


def misbehaving(mode: str, report: Path) -> object:
    from workbench.workloads import Workload

    return Workload.from_callables(
        model_fn=lambda: Misbehave(mode, str(report)),
        batch_fn=lambda n, g: (torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
        name=f"misbehave-{mode}",
    )


def _raise_line() -> int:
    lines, first = inspect.getsourcelines(Misbehave.forward)
    return first + next(i for i, line in enumerate(lines) if "raise ValueError" in line)


def _kill_when_noted(report: Path, killed: dict[str, float], stop: threading.Event) -> None:
    """SIGKILL rank 1 from outside, found by the pid it reported itself."""
    while not stop.is_set():
        if report.exists():
            pid = json.loads(report.read_text())["pid"]
            killed["time"] = time.time()
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)


CASES = {
    "raise": ("error", None),
    "hang": ("timeout", None),
    "exit": ("error", 7),
    "segfault": ("error", -signal.SIGSEGV),
    "sigkill": ("error", -signal.SIGKILL),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_the_first_rank_to_fail_is_named_with_its_cause(mode: str, tmp_path: Path) -> None:
    status, exitcode = CASES[mode]
    report, killed, stop = tmp_path / "rank1.json", {}, threading.Event()
    killer = threading.Thread(target=_kill_when_noted, args=(report, killed, stop), daemon=True)
    if mode == "sigkill":
        killer.start()
    store = tmp_path / "history.sqlite"
    timeout_s = HANG_TIMEOUT_S if mode == "hang" else TIMEOUT_S
    try:
        result = run_and_store(misbehaving(mode, report), TrainConfig(strategy="ddp", nproc_per_node=2), warmup=1,
                               steps=5, device="cpu", timeout_s=timeout_s, store=store)  # fmt: skip
    finally:
        stop.set()
    ended = time.time()
    noted = json.loads(report.read_text())
    first_line = result.message.splitlines()[0]
    assert result.status == status, result.message

    info = result.distributed
    assert info is not None and info["first_failed_rank"] == BAD_RANK, result.message
    records = {r["rank"]: RankFailure.from_dict(r) for r in info["rank_failures"]}
    bad = records[BAD_RANK]
    assert bad.pid == noted["pid"] and bad.consequence is None
    if mode == "hang":
        assert f"no progress from any rank for {timeout_s} s" in first_line
        assert "rank 1 is furthest behind" in first_line
        assert bad.how == "hung" and records[0].how == "waiting"
        # Stopped by the timeout, soon after it (the silence may start a poll before rank 1 noted the time).
        assert timeout_s - 1 <= ended - noted["time"] < timeout_s + 15
    else:
        # Rank 1 is named, with its cause; rank 0 (its echo or stopped by torchrun) is listed under it.
        assert first_line.startswith(f"rank {BAD_RANK} failed first: {bad.cause}"), result.message
        assert "then, as a consequence:\n  rank 0: " in result.message, result.message
        assert records[0].consequence is not None
        assert ended - noted["time"] < TIMEOUT_S  # ended by the failure, not by the timeout
        assert bad.died_at is not None
        if mode == "raise":
            assert bad.how == "exception" and bad.exception == f"ValueError: bad sample on rank {BAD_RANK}"
            assert bad.where == f"{Path(__file__).resolve()}:{_raise_line()} in forward"
            assert "Traceback" in result.message and bad.exitcode == 1  # torchrun's record joined the rank's own
            assert noted["time"] <= bad.died_at <= noted["time"] + 1.0
        else:
            assert bad.how in ("exit", "signal") and bad.exitcode == exitcode
            assert first_line.startswith(f"rank 1 failed first: {describe_exit(exitcode)}")
            since = killed.get("time", noted["time"])  # the exit or kill happened right after this
            assert since <= bad.died_at <= since + 1.0, (since, bad.died_at)
        assert time.strftime("%H:%M:%S", time.localtime(bad.died_at)) in first_line

    assert no_live_children()
    with Store(store) as history:
        stored = history.get(result.trial_id).result
    assert stored.status == result.status and stored.message == result.message
    assert stored.distributed is not None and stored.distributed["rank_failures"] == info["rank_failures"]


# --- the rule, on plain records ------------------------------------------------------------


def test_an_echo_reported_before_the_death_it_echoes_is_still_not_the_cause() -> None:
    """Rank 0's connection reset is stamped 5 ms before rank 1 is seen dead: rank 1 is the cause."""
    failures = assemble_failures(
        errors={0: {"time": 100.000, "exception": "RuntimeError: [pair.cc:534] Read error: Connection reset by peer"}},
        ended={0: 100.050, 1: 100.005},
        torchrun={1: {"exitcode": -9, "pid": 42, "timestamp": 100.0}},
        finished=[],
        ranks={0: {"pid": 41, "host": "h"}, 1: {"pid": 42, "host": "h"}},
    )
    assert first_failure(failures).rank == 1
    root, message = explain_failures(failures)
    assert root.rank == 1
    assert message.startswith("rank 1 failed first: killed by SIGKILL (the OOM killer or an external kill) (at ")
    assert "\nthen, as a consequence:\n  rank 0: RuntimeError: [pair.cc:534] Read error" in message


def test_without_an_echo_the_earliest_failure_is_the_cause_and_stopped_ranks_are_consequences() -> None:
    failures = assemble_failures(
        errors={2: {"time": 10.5, "exception": "ValueError: late"}, 3: {"time": 10.2, "exception": "KeyError: 'x'"}},
        ended={0: 10.9, 1: 10.4},
        torchrun={1: {"exitcode": 3, "pid": 7, "timestamp": 10}, 0: {"exitcode": -signal.SIGTERM, "pid": 6}},
        finished=[4],
        ranks={},
    )
    root, message = explain_failures(failures)
    assert root.rank == 3 and first_failure(failures) is root
    by_rank = {f.rank: f for f in failures}
    assert by_rank[0].consequence is not None  # SIGTERM after the first failure: torchrun stopping it
    assert by_rank[1].consequence is None and by_rank[2].consequence is None  # failures of their own
    assert "also failed, later:\n  rank 1: exit code 3, +0.200 s\n  rank 2: ValueError: late, +0.300 s" in message
    assert 4 not in by_rank  # it finished


def test_a_sigterm_is_the_cause_only_before_any_other_failure() -> None:
    """One rank preempted with SIGTERM: the cause. The rank torchrun then stops the same way: not."""
    failures = assemble_failures(
        errors={}, ended={1: 5.0, 0: 5.3}, torchrun={0: {"exitcode": -15}, 1: {"exitcode": -15}}, finished=[], ranks={}
    )
    root, message = explain_failures(failures)
    assert root.rank == 1 and message.startswith("rank 1 failed first: killed by signal SIGTERM (")
    assert next(f for f in failures if f.rank == 0).consequence is not None


def test_consequence_errors_are_recognized_and_others_are_not() -> None:
    assert consequence_of("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer")
    assert consequence_of("DistBackendError: NCCL communicator was aborted on rank 1.")
    assert consequence_of("RuntimeError: ... Timed out waiting 1800000ms for recv operation to complete")
    assert consequence_of("ValueError: bad sample on rank 1") is None
    # The same words from the user's own code (a data server down) are not a peer's echo.
    assert consequence_of("ConnectionRefusedError: [Errno 111] Connection refused") is None
    assert consequence_of("torch.OutOfMemoryError: CUDA out of memory.") is None


def test_an_exit_is_described_in_words() -> None:
    assert describe_exit(7) == "exit code 7"
    assert describe_exit(-signal.SIGSEGV) == "killed by signal SIGSEGV (segmentation fault)"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL (the OOM killer or an external kill)"
    # A signal without words of our own gets the C library's.
    assert describe_exit(-signal.SIGHUP) == f"killed by signal SIGHUP ({signal.strsignal(signal.SIGHUP).lower()})"


def test_torchruns_failures_become_the_agents_record(tmp_path: Path) -> None:
    """torch's own ProcessFailure, with and without a rank's error file, read into plain data."""
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {"message": "ValueError: x", "extraInfo": {
        "py_callstack": "Traceback (most recent call last): ...", "timestamp": "1700000000"}}}))  # fmt: skip
    failures = {
        1: ProcessFailure(local_rank=1, pid=4242, exitcode=-signal.SIGKILL, error_file=str(tmp_path / "absent")),
        0: ProcessFailure(local_rank=0, pid=4241, exitcode=1, error_file=str(error_file)),
    }
    record = failure_record(failures)
    assert record["1"]["exitcode"] == -9 and record["1"]["pid"] == 4242 and record["1"]["message"] == ""
    assert record["0"]["message"].startswith("Traceback") and record["0"]["timestamp"] == 1700000000
