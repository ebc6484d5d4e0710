"""wb.watch on real loops: figures against the loop's own clock, a killed job, a dead store, misuse,
bounded memory, and the history/regress commands over watched runs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import workbench as wb
from workbench.cli import main as cli_main
from workbench.store import Store
from workbench.store.watched import STALE_AFTER_S, watch_steps, watched_run, watched_runs

ROOT = Path(__file__).resolve().parents[1]


def run_script(tmp_path: Path, body: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-W", "always", str(script), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=tmp_path)  # fmt: skip


LOOP = """
import json, sys, time, torch
import workbench as wb

SLEEP = float(sys.argv[2])
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
waits, ends = [], []

def loader(n):
    for _ in range(n):
        time.sleep(SLEEP)
        yield torch.randn(8, 16)

with wb.watch(model, opt, name="slow-loader", store=sys.argv[1], config={"lr": 0.01, "batch": 8},
              flush_s=0.2, warmup=2) as w:
    it = iter(w.batches(loader(int(sys.argv[3]))))
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        waits.append((time.perf_counter() - t0) * 1000)
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        w.step(loss=loss)
        ends.append(time.perf_counter())
print(json.dumps({"waits": waits, "ends": ends}))
"""


def test_slow_loader_data_wait_and_step_time_match_the_loops_own_clock(tmp_path: Path, capsys) -> None:
    store_path = tmp_path / "h.sqlite"
    done = run_script(tmp_path, LOOP, str(store_path), "0.03", "25")
    assert done.returncode == 0, done.stderr
    truth = json.loads(done.stdout)
    with Store(store_path) as store:
        (run,) = watched_runs(store)
        rows = watch_steps(store, run.run_id, recent=True)
    assert (run.status, run.last_step, run.config) == ("ended", 25, {"lr": 0.01, "batch": 8})
    assert [r.first_step for r in rows] == list(range(1, 26))
    # Steps after the first (the first is marked by the optimizer hook, before step() takes over).
    for row, wait in zip(rows[1:], truth["waits"][1:]):
        assert row.data_ms == pytest.approx(wait, rel=0.1, abs=1.0)
        assert row.forward_ms is not None and row.backward_ms is not None and row.optimizer_ms is not None
        assert row.loss is not None
    intervals = [(b - a) * 1000 for a, b in zip(truth["ends"], truth["ends"][1:])]
    for row, interval in zip(rows[2:], intervals[1:]):
        assert row.step_ms == pytest.approx(interval, rel=0.1, abs=1.0)
    assert run.summary["steady_median_ms"] >= 30.0

    assert cli_main(["history", "--store", str(store_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["kind"], r["workload"], r["status"], r["steps"]) for r in listed] == [
        ("watch", "slow-loader", "ended", 25)
    ]


def test_a_killed_job_keeps_its_rows_and_reads_as_killed(tmp_path: Path) -> None:
    store_path = tmp_path / "h.sqlite"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(LOOP))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen([sys.executable, str(script), str(store_path), "0.005", "1000000"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        last = 0
        while time.monotonic() < deadline and last < 30:
            time.sleep(0.3)
            if store_path.exists():
                with Store(store_path) as store:
                    runs = watched_runs(store)
                    last = runs[0].last_step if runs else 0
        assert last >= 30, "the job did not store 30 steps in time"
        with Store(store_path) as store:  # alive: a silent writer alone is not a killed job
            assert watched_runs(store, now=time.time() + STALE_AFTER_S + 1)[0].status == "running"
        os.kill(job.pid, signal.SIGKILL)
        job.wait(10)
    finally:
        job.kill()
    with Store(store_path) as store:
        run = watched_runs(store)[0]
        later = watched_run(store, run.run_id, now=time.time() + STALE_AFTER_S + 1)
        rows = watch_steps(store, run.run_id, recent=True)
    assert run.status == "running"  # its heartbeat is still fresh
    assert later.status == "killed" and later.last_step >= 30
    assert f"stopped reporting after step {later.last_step}" in later.message, later.message
    assert rows[-1].first_step == later.last_step and len(rows) == later.last_step


TERMINATED = """
import sys, time
import workbench as wb

with wb.watch(name="terminated", store=sys.argv[1], flush_s=30) as w:  # no flush of its own before the signal
    for step in range(1, 1_000_000):
        time.sleep(0.01)
        w.step(loss=1.0)
        print(step, flush=True)
"""


def test_a_sigterm_stores_the_steps_so_far_marks_the_run_failed_and_still_kills(tmp_path: Path) -> None:
    """SIGTERM is a request to stop from outside (a scheduler's preemption, torchrun after another rank
    failed): the run did not finish, so it reads 'failed' (not 'ended', which `regress` would take
    as a complete run), saying the signal; the process then dies of it as it would have unwatched."""
    store_path = tmp_path / "h.sqlite"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(TERMINATED))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script), str(store_path)]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as job:
        try:
            assert job.stdout is not None
            printed = [int(job.stdout.readline()) for _ in range(20)]
            job.send_signal(signal.SIGTERM)
            printed += [int(line) for line in job.stdout.read().split()]
            job.wait(20)
        finally:
            job.kill()
    assert job.returncode == -signal.SIGTERM
    with Store(store_path) as store:
        (run,) = watched_runs(store)
        rows = watch_steps(store, run.run_id, recent=True)
    assert run.status == "failed" and run.message.startswith("killed by signal SIGTERM"), run
    assert run.summary["failure"]["exitcode"] == -signal.SIGTERM
    # every step the job took before the signal stored (it may take one more before the handler runs)
    assert printed[-1] <= run.last_step <= printed[-1] + 1 and len(rows) == run.last_step


def test_a_sigterm_the_job_handles_itself_is_theirs_after_the_steps_so_far_are_stored(tmp_path: Path) -> None:
    """A handler of the user's (Lightning's graceful stop, a checkpoint-on-preemption) runs after the flush,
    and the run goes on; leaving the watch puts their handler back."""
    path = tmp_path / "h.sqlite"
    seen: list[int] = []

    def theirs(signum: int, frame: object) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, theirs)
    try:
        with wb.watch(name="handled", store=path, flush_s=30) as w:
            for _ in range(5):
                w.step()
            os.kill(os.getpid(), signal.SIGTERM)  # handled in this (the main) thread before the next line
            with Store(path) as store:
                (run,) = watched_runs(store)
            assert seen == [signal.SIGTERM] and (run.status, run.last_step) == ("running", 5), run
            w.step()
        assert signal.getsignal(signal.SIGTERM) is theirs
    finally:
        signal.signal(signal.SIGTERM, before)
    with Store(path) as store:
        (run,) = watched_runs(store)
    assert (run.status, run.message, run.last_step) == ("ended", "", 6)


# The thread's exception reaches pytest's own hook too, after ours: that warning is the point here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_training_thread_that_dies_inside_an_open_watch_fails_its_run(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "h.sqlite"

    def train() -> None:
        w = wb.watch(name="in-a-thread", store=path, flush_s=30)
        w.__enter__()  # never left: the exception below ends the thread with the watch open
        for _ in range(4):
            w.step()
        raise ValueError("bad shard")

    thread = threading.Thread(target=train)
    thread.start()
    thread.join(10)
    with Store(path) as store:
        (run,) = watched_runs(store)
    assert (run.status, run.last_step) == ("failed", 4) and run.message.startswith("ValueError: bad shard, at "), run
    assert "test_watch.py" in run.message and "in train" in run.message, run.message


def test_a_dead_store_never_raises_or_slows_the_loop(tmp_path: Path) -> None:
    body = """
    import sys, time
    import workbench as wb
    times = []
    with wb.watch(name="dead-store", store=sys.argv[1], flush_s=0.05, capacity=16) as w:
        end = time.perf_counter() + 1.5
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            time.sleep(0.001)
            w.step()
            times.append(time.perf_counter() - t0)
    print(max(times), w.steps, w.dropped_steps, w.dropped_writes)
    """
    (tmp_path / "file").write_text("not a folder")
    unwritable = run_script(tmp_path, body, str(tmp_path / "file" / "h.sqlite"))
    assert unwritable.returncode == 0, unwritable.stderr
    slowest, steps, dropped_steps, dropped_writes = unwritable.stdout.split()
    assert float(slowest) < 0.05 and int(dropped_writes) >= 10
    assert unwritable.stderr.count("cannot write the run history") == 1

    locked = tmp_path / "locked.sqlite"
    Store(locked).close()
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # the writer now waits on SQLite's busy timeout, on its own thread
    try:
        started = time.monotonic()
        done = run_script(tmp_path, body, str(locked))
        took = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert done.returncode == 0, done.stderr
    slowest, steps, dropped_steps, _ = done.stdout.split()
    # The hand-off is full (16) while the writer waits: further steps are dropped and counted, none waits.
    assert float(slowest) < 0.05 and int(dropped_steps) > 0 and int(steps) > 100
    assert took < 25  # leaving the context waits for the last flush at most a few seconds


def test_misuse_gets_one_clear_message_each_and_no_traceback(tmp_path: Path) -> None:
    body = """
    import workbench as wb
    w = wb.watch(name="misused", store=None)
    for _ in range(3):
        w.step()                          # before the with-block
    with w:
        with wb.watch(name="inner", store=None) as inner:
            for _ in range(3):
                inner.step()              # the nested watch is inert
                w.step()
    with wb.watch(name="idle", store=None):
        pass                              # no step at all
    print("job finished")
    """
    done = run_script(tmp_path, body)
    assert done.returncode == 0 and done.stdout.strip() == "job finished", done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("outside `with wb.watch(...)`") == 1
    assert done.stderr.count("wb.watch('inner') inside wb.watch('misused') is ignored") == 1
    assert done.stderr.count("wb.watch('idle') saw no step") == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_long_run_keeps_bounded_rows_in_memory_and_in_the_store(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Also on a shared PostgreSQL history: the flushes' upserts and deletes are the same SQL there."""
    path = str(request.getfixturevalue("postgres_url")) if backend == "postgresql" else tmp_path / "h.sqlite"
    with wb.watch(name="long", store=path, flush_s=0.05, max_rows=64, recent=32, capacity=4096) as w:
        for _ in range(100_000):
            w.step()
    history = w._writer.history
    assert len(history.buckets) <= 64 and len(history.recent) == 32 and history.stride > 1
    with Store(path) as store:
        run = watched_runs(store)[0]
        stored = watch_steps(store, run.run_id)
        recent = watch_steps(store, run.run_id, recent=True)
    # Every step is either in the downsampled history or counted as dropped: none vanishes silently.
    assert sum(r.steps for r in stored) + w.dropped_steps == 100_000
    assert len(stored) <= 64 and len(recent) == 32
    # Steps keep their numbers in the loop, dropped or not: the last one stored is the last one received.
    assert recent[-1].first_step == run.last_step == history.last_step


def test_the_first_step_whose_loss_is_not_finite_is_recorded(tmp_path: Path, capsys) -> None:
    """NaN at step 7, fine at 8, infinite from 15: the summary says 7, though the downsampled history
    (buckets of 8 steps here) only knows that the bucket of steps 1-8 has no finite mean (SQLite
    stores a NaN as NULL)."""
    import torch

    path = tmp_path / "h.sqlite"
    with wb.watch(name="diverges", store=path, flush_s=0.05, max_rows=4, recent=4) as w:
        for step in range(1, 21):
            loss = float("nan") if step == 7 else float("inf") if step >= 15 else 1.0 / step
            w.step(loss=torch.tensor(loss))
    with Store(path) as store:
        (run,) = watched_runs(store)
        stored = watch_steps(store, run.run_id)
    assert run.summary["first_nonfinite_loss_step"] == 7, run.summary
    assert (stored[0].first_step, stored[0].steps, stored[0].loss) == (1, 8, None), stored
    assert cli_main(["history", "--store", str(path)]) == 0
    assert "non-finite loss from step 7" in capsys.readouterr().out

    with wb.watch(name="fine", store=path, flush_s=0.05) as w:
        for step in range(1, 6):
            w.step(loss=torch.tensor(1.0 / step))
    with Store(path) as store:
        assert watched_runs(store, name="fine")[0].summary["first_nonfinite_loss_step"] is None


def _sleepy_run(path: Path, name: str, sleep_s: float, steps: int = 40) -> None:
    with wb.watch(name=name, store=path, flush_s=0.1, warmup=3) as w:
        for _ in range(steps):
            time.sleep(sleep_s)
            w.step()


def test_regress_holds_a_watched_run_against_its_reference(tmp_path: Path, capsys) -> None:
    path = tmp_path / "h.sqlite"
    _sleepy_run(path, "nightly", 0.010)
    _sleepy_run(path, "nightly", 0.010)
    assert cli_main(["regress", "--watched", "nightly", "--store", str(path), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)["rows"][0]
    assert same["status"] == "pass" and same["reference"] == "run:1"

    _sleepy_run(path, "nightly", 0.016)  # an injected 60% slowdown
    assert cli_main(["regress", "--watched", "nightly", "--store", str(path), "--json"]) == 1
    slow = json.loads(capsys.readouterr().out)["rows"][0]
    assert slow["status"] == "regression" and slow["reference"] == "run:2"
    assert slow["time_change"] == pytest.approx(0.6, abs=0.2)
    assert cli_main(["regress", "--watched", "3", "--against", "run:1", "--store", str(path), "--json"]) == 1
    assert cli_main(["regress", "--watched", "nope", "--store", str(path)]) != 0
