"""Trials in a worker process: every failure ends the worker, never the caller, and becomes a status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from proc_watch import WORKER_COMMAND, no_live_children, start_cli_and_wait_for_steps, still_running_after
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.measure import StepMeasured, TrialFinished, TrialStarted
from workbench.trials import run_trial
from workbench.workloads import Workload, WorkloadError


class Misbehaving(nn.Module):
    """Behaves for `good_calls` forwards, then does one bad thing (in the worker)."""

    def __init__(self, mode: str = "ok", good_calls: int = 2, sleep_s: float = 0.0) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.mode, self.good_calls, self.sleep_s = mode, good_calls, sleep_s
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.sleep_s)
        if self.calls > self.good_calls:
            if self.mode == "raise":
                raise ValueError("bad tensor shape in user code")
            if self.mode == "oom":
                torch.empty(8 * 1024**3, dtype=torch.uint8).fill_(1)  # 8 GiB, far above the limit
            if self.mode == "hang":
                time.sleep(600)
            if self.mode == "crash":
                os._exit(3)
            if self.mode == "nan":
                return self.linear(x) * float("nan")
        return self.linear(x)


def workload(mode: str = "ok", good_calls: int = 2, sleep_s: float = 0.0) -> Workload:
    return Workload.from_callables(
        model_fn=lambda: Misbehaving(mode, good_calls, sleep_s),
        batch_fn=lambda n, g: (torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
        name=f"misbehaving-{mode}",
    )


def test_a_healthy_trial_streams_events_as_they_happen() -> None:
    received: list[tuple[float, object]] = []
    result = run_trial(
        workload(sleep_s=0.1), steps=8, warmup=1, on_event=lambda e: received.append((time.monotonic(), e))
    )
    assert result.status == "ok", result.message
    kinds = [type(e) for _, e in received]
    assert kinds[0] is TrialStarted and kinds[-1] is TrialFinished
    steps = [(t, e) for t, e in received if isinstance(e, StepMeasured)]
    assert len(steps) == 9
    # Streamed, not delivered at the end: the first step arrived long before the last.
    assert steps[-1][0] - steps[0][0] > 0.5
    assert result.worker_pid not in (None, os.getpid())


def test_each_trial_gets_a_fresh_process() -> None:
    first = run_trial(workload(), steps=1, warmup=1)
    second = run_trial(workload(), steps=1, warmup=1)
    assert first.worker_pid != second.worker_pid


def test_user_exception_is_an_error_result_with_traceback() -> None:
    result = run_trial(workload("raise"), steps=5, warmup=1)
    assert result.status == "error"
    assert "ValueError: bad tensor shape in user code" in result.message and "Traceback" in result.message
    assert run_trial(workload(), steps=1, warmup=1).status == "ok"  # the parent keeps working


def test_memory_limit_turns_an_allocation_into_oom() -> None:
    result = run_trial(workload("oom"), steps=5, warmup=1, memory_limit_bytes=3 * 1024**3)
    assert result.status == "oom", result.message
    assert "memory" in result.message


def test_worker_start_up_does_not_count_against_the_timeout() -> None:
    """Spawning and `import torch` take seconds; a 1 s silence limit still lets a healthy, fast trial
    finish, because the limit counts from the trial's start (start-up gets its own grace)."""
    result = run_trial(workload("ok", good_calls=100), steps=3, warmup=1, timeout_s=1)
    assert result.ok, result.message


def test_a_hang_is_killed_after_timeout() -> None:
    begin = time.monotonic()
    # The clock restarts at every event, so a slow worker start-up on a busy machine is not a hang.
    result = run_trial(workload("hang"), steps=5, warmup=1, timeout_s=4)
    assert result.status == "timeout"
    assert "no progress for 4 s" in result.message
    assert time.monotonic() - begin < 60
    assert result.warmup_step_ms and len(result.step_ms) == 1  # what was measured before the hang is kept
    assert no_live_children()


def test_cancel_from_another_thread_ends_the_trial_within_a_second() -> None:
    cancel = threading.Event()
    cancelled_at: list[float] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepMeasured) and event.step == 2 and not cancel.is_set():
            threading.Timer(0.0, lambda: (cancelled_at.append(time.monotonic()), cancel.set())).start()

    result = run_trial(
        workload(sleep_s=0.05, good_calls=10**6), steps=10_000, warmup=1, cancel=cancel, on_event=on_event
    )
    assert result.status == "cancelled"
    assert time.monotonic() - cancelled_at[0] < 1.0
    assert no_live_children()


def test_a_crashing_worker_is_reported_not_propagated() -> None:
    result = run_trial(workload("crash"), steps=5, warmup=1)
    assert result.status == "error"
    assert "exit code 3" in result.message


def test_nan_loss_is_diverged_with_its_step() -> None:
    result = run_trial(workload("nan", good_calls=3), steps=5, warmup=1)
    assert result.status == "diverged" and result.diverged_step == 3


def test_unpicklable_workload_names_the_culprit_and_the_fix() -> None:
    lock = threading.Lock()
    bad = Workload.from_callables(
        model_fn=lambda: (lock, nn.Linear(8, 1))[1],
        batch_fn=lambda n, g: (torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        name="holds-a-lock",
    )
    with pytest.raises(WorkloadError, match=r"holds-a-lock.*its model_fn.*cannot be pickled.*package\.module:function"):
        run_trial(bad, steps=1, warmup=1)


def test_input_errors_found_in_the_worker_are_raised_in_the_caller() -> None:
    config = TrainConfig(activation_checkpointing="full", checkpoint_target="NoSuchBlock")
    with pytest.raises(ConfigError, match="NoSuchBlock"):
        run_trial("bev-perception", config, steps=1, warmup=1)
    with pytest.raises(WorkloadError, match="unknown workload"):
        run_trial("no-such-workload", steps=1, warmup=1)


def test_a_model_class_defined_in_main_travels_by_value(tmp_path: Path) -> None:
    """What a notebook does: the class lives in __main__, which the worker cannot import."""
    script = tmp_path / "notebook_like.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        from torch import nn
        from workbench.trials import run_trial
        from workbench.workloads import Workload

        class CellDefinedNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
            def forward(self, x):
                return self.net(x)

        if __name__ == "__main__":
            w = Workload.from_callables(
                model_fn=CellDefinedNet,
                batch_fn=lambda n, g: (torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g)),
                loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
                name="cell-defined",
            )
            result = run_trial(w, steps=3, warmup=1)
            print("STATUS", result.status, result.workload, result.message[:300])
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False
    )
    assert "STATUS ok cell-defined" in proc.stdout, proc.stdout + proc.stderr


def test_a_script_without_a_main_guard_runs_trials_and_only_once(tmp_path: Path) -> None:
    """The README's "From Python" shape saved as a plain script: multiprocessing's spawn would
    re-run it in the worker and fail; the worker is a fresh `python -m` interpreter instead.
    The side-effect counter proves the script body ran exactly once."""
    script = tmp_path / "plain_script.py"
    counter = tmp_path / "runs.txt"
    script.write_text(
        textwrap.dedent(f"""
        from pathlib import Path
        from workbench.api import Protocol, run_comparison
        from workbench.config import TrainConfig
        from workbench.trials import run_trial

        with open({str(counter)!r}, "a") as f:
            f.write("ran\\n")
        result = run_trial("bev-perception", steps=2, warmup=1)
        print("STATUS", result.status, result.workload)
        outcome = run_comparison("bev-perception", TrainConfig(), [TrainConfig()], steps=2, warmup=1, store=None,
                                 protocol=Protocol(budget_s=1, block_steps=1))
        print("DESIGN", outcome.comparison.design, outcome.comparison.rounds)
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False
    )
    assert "STATUS ok bev-perception" in proc.stdout, proc.stdout + proc.stderr
    assert "DESIGN paired 6" in proc.stdout, proc.stdout + proc.stderr
    assert counter.read_text().splitlines() == ["ran"]


def test_an_orphaned_worker_ends_when_its_parent_dies(tmp_path: Path) -> None:
    """A parent killed mid-trial (a crashed kernel) must not leave its worker burning the CPUs."""
    script = tmp_path / "dies.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, threading, time
        from workbench.measure import TrialStarted
        from workbench.trials import run_trial

        def on_event(event):
            if isinstance(event, TrialStarted):
                print("WORKER", event.trial_id, flush=True)
                os._exit(0)  # the parent vanishes while its worker runs
        run_trial("bev-perception", steps=500, warmup=1, on_event=on_event)
    """)
    )
    before = {p.pid for p in psutil.process_iter()}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False
    )
    assert "WORKER" in proc.stdout, proc.stdout + proc.stderr  # the worker was running when the parent died
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        workers = [
            p for p in psutil.process_iter(["pid", "cmdline"])
            if p.pid not in before and WORKER_COMMAND in " ".join(p.info["cmdline"] or [])
        ]  # fmt: skip
        if not workers:
            break
        time.sleep(0.2)
    assert not workers, [w.info for w in workers]


def test_background_handle_keeps_the_caller_free_and_cancels() -> None:
    from workbench.api import start_trial

    measuring = threading.Event()
    handle = start_trial(workload(sleep_s=0.05, good_calls=10**6), steps=10_000, warmup=1,
                         on_event=lambda e: measuring.set() if isinstance(e, StepMeasured) and e.timed else None)  # fmt: skip
    assert not handle.done()  # returned at once: the trial runs on its own thread and process
    assert measuring.wait(timeout=60)
    handle.cancel()
    result = handle.result(timeout=5)
    assert result.status == "cancelled" and result.step_ms  # it had been measuring


def test_prestarted_workers_wait_idle_then_run_trials_and_unused_ones_end() -> None:
    """Spares import while nothing is measured, use no CPU while they wait, take the next trials
    (the trial's worker_pid is a spare's), and `discard_spares` ends the ones left over."""
    from workbench.measure import child

    assert child.prestart(2) == 2
    pids = [spare.process.pid for spare in child._spares]
    idle = [psutil.Process(pid) for pid in pids]
    for proc in idle:
        proc.cpu_percent(None)
    time.sleep(0.5)
    assert all(proc.cpu_percent(None) < 5 for proc in idle)  # blocked reading their job
    try:
        result = run_trial(workload(), steps=2, warmup=1)
        assert result.ok, result.message
        assert result.worker_pid == pids[0]
    finally:
        child.discard_spares()
    assert not child._spares
    assert no_live_children()


def test_a_killed_cli_leaves_no_worker_running() -> None:
    """SIGKILL on `workbench run` mid-trial: the worker, re-parented, must end itself within seconds."""
    cli, workers = start_cli_and_wait_for_steps(["run", "--steps", "100000", "--warmup", "1", "--no-store"])
    assert any(WORKER_COMMAND in " ".join(p.cmdline()) for p in workers), workers
    cli.kill()
    cli.communicate()
    assert not still_running_after(workers, within_s=5)


def test_a_worker_busy_in_its_job_ends_when_its_parent_dies(tmp_path: Path) -> None:
    """A job that never reads its pipe (a paired session building or timing its models) still notices."""
    script = tmp_path / "busy_parent.py"
    script.write_text(
        textwrap.dedent("""
        import os, time
        from workbench.measure.child import ChildProcess

        def busy(requests, replies):
            replies.send(os.getpid())
            time.sleep(600)

        child = ChildProcess(busy)
        print(child.inbox.recv(), flush=True)
        os._exit(0)
    """)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    worker = psutil.Process(int(proc.stdout.split()[0]))
    assert not still_running_after([worker], within_s=5)
