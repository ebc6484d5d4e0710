"""A watched torchrun job: every rank writes its run, the ranks join into one job, a rank whose
loader is slowed on purpose is named the straggler with its data wait, and a rank that raises is
named the job's first failure with its line (2 real gloo ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import workbench as wb
from workbench.store import Store
from workbench.store.watched import watched_runs

ROOT = Path(__file__).resolve().parents[1]

JOB = """
import sys, time, torch, torch.distributed as dist
import workbench as wb

dist.init_process_group("gloo")
rank = dist.get_rank()
SLOW_RANK, SLEEP_S = int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                                                      torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def loader(n):
    # ~20 ms of compute a step: rank 0's own sub-ms extras (it hosts torchrun's store; its writer
    # flushes) stay under the straggler rule's 5% margin. At 256 rows the step was 2.6 ms, and a
    # quiet launch read rank 0 0.6 ms (23%) late in 11 of 13 steps: real, but not a fault. The
    # batch is made once: drawing 2M random numbers a step would itself be a data wait.
    batch = torch.randn(8192, 256)
    for _ in range(n):
        if rank == SLOW_RANK:
            time.sleep(SLEEP_S)  # this rank's data pipeline is the slow one
        yield batch

with wb.watch(model, opt, name="ddp-job", store=sys.argv[1], warmup=3, flush_s=0.2) as w:
    for batch in w.batches(loader(int(sys.argv[4]))):
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        w.step(loss=loss)
dist.destroy_process_group()
"""


def run_job(tmp_path: Path, store: Path, slow_rank: int, sleep_s: float, steps: int) -> None:
    proc = torchrun(tmp_path, JOB, str(store), str(slow_rank), str(sleep_s), str(steps))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def torchrun(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`body` as job.py under torchrun on 2 gloo ranks, one thread each (the machine may have 2 cores)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)


def test_the_rank_with_the_slow_loader_is_named_the_straggler_with_its_data_wait(tmp_path: Path) -> None:
    store = tmp_path / "history.db"
    run_job(tmp_path, store, slow_rank=1, sleep_s=0.05, steps=30)
    # a second launch of the same script, no rank slowed: not even a sleep(0), whose yield on two busy
    # cores is a real sub-ms delay that a 2 ms step counts as a straggler
    run_job(tmp_path, store, slow_rank=-1, sleep_s=0.0, steps=16)

    with Store(store) as db:
        runs = watched_runs(db, name="ddp-job", limit=None)
    assert len(runs) == 4 and {r.world_size for r in runs} == {2}
    first, second = {r.job for r in runs if r.run_id <= 2}, {r.job for r in runs if r.run_id > 2}
    assert len(first) == len(second) == 1 and first != second, "one job id per launch, shared by its ranks"

    job = wb.watch.watched_job(next(iter(first)), store=store)
    assert [r.rank for r in job.ranks] == [0, 1] and all(r.status == "ended" for r in job.ranks)
    assert job.straggler == 1, job.describe()
    slow, fast = job.ranks[1], job.ranks[0]
    assert slow.data_ms is not None and 40 <= slow.data_ms <= 200, job.describe()  # the 50 ms sleep, seen
    assert fast.data_ms is not None and fast.data_ms < 10, job.describe()
    # the fast rank waits for the slow one in backward's all-reduce: both steps take the sleep
    assert fast.step_ms is not None and fast.step_ms >= 40, job.describe()
    assert "straggler: rank 1" in job.describe()

    newest = wb.watch.watched_job("ddp-job", store=store)  # by name: the newest launch
    assert newest.job == next(iter(second)) and newest.straggler is None, newest.describe()
    view = wb.ui.Watch("ddp-job", store=store, start=False)  # the notebook view: the newest launch, per rank
    view.refresh()
    assert view.steps.data["label"] == ["rank 0", "rank 1"] and {r.job for r in view.runs} == second
    assert "the ranks keep pace" in view.table.value
    view = wb.ui.Watch(next(iter(first)), store=store, start=False)  # a job id names that launch
    view.refresh()
    assert "straggler: rank 1" in view.table.value and view.waits.data["label"][1] == "rank 1 data wait"

    # the command line says the same, and history names each rank's run
    shown = subprocess.run([sys.executable, "-m", "workbench.cli", "job", job.job, "--store", str(store)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0 and "straggler: rank 1" in shown.stdout, shown.stdout + shown.stderr
    listed = subprocess.run([sys.executable, "-m", "workbench.cli", "history", "--store", str(store)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "ddp-job rank 1/2" in listed.stdout, listed.stdout
    missing = subprocess.run([sys.executable, "-m", "workbench.cli", "job", "no-such-job", "--store", str(store)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "no multi-process watched job 'no-such-job'" in missing.stderr


FAILING_JOB = """
import sys, torch, torch.distributed as dist
import workbench as wb

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with wb.watch(model, opt, name="ddp-fails", store=sys.argv[1], warmup=2, flush_s=0.2) as w:
    for step in range(1, 31):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        if rank == 1 and step == 12:
            raise RuntimeError("rank 1 read a corrupt batch at step 12")  # the line the job names
        loss.backward()
        opt.step()
        opt.zero_grad()
        w.step(loss=loss)
dist.destroy_process_group()
"""


def test_a_rank_that_raises_fails_the_job_named_with_its_exception_and_line(tmp_path: Path) -> None:
    store = tmp_path / "history.db"
    proc = torchrun(tmp_path, FAILING_JOB, str(store))
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(i for i, text in enumerate(textwrap.dedent(FAILING_JOB).splitlines(), 1) if "corrupt batch" in text)

    with Store(store) as db:
        runs = {r.rank: r for r in watched_runs(db, name="ddp-fails", limit=None)}
    assert set(runs) == {0, 1}
    failed = runs[1]
    assert failed.status == "failed" and failed.last_step == 11, failed
    assert "RuntimeError: rank 1 read a corrupt batch at step 12" in failed.message, failed.message
    assert f"job.py:{line} in <module>" in failed.message, failed.message
    # rank 0 waited in backward's all-reduce for rank 1: it ends by gloo's error or torchrun's SIGTERM,
    # either way written as failed, never left 'running'
    assert runs[0].status == "failed" and runs[0].last_step == 11, runs[0]

    job = wb.watch.watched_job("ddp-fails", store=store)
    assert job.status == "failed" and job.first_failed is not None and job.first_failed.rank == 1, job.describe()
    head = job.describe().splitlines()
    assert head[0].startswith("ddp-fails: failed, 2 of 2 rank(s) watched"), head
    assert head[1].startswith("rank 1 failed first: RuntimeError: rank 1 read a corrupt batch"), head
    assert f"job.py:{line}" in head[1] and "rank 0:" in job.describe(), job.describe()
    assert head[2] == "then, as a consequence:", (
        "rank 0's end (gloo's error or torchrun's SIGTERM) only echoes rank 1's"
    )

    view = wb.ui.Watch("ddp-fails", store=store, start=False)  # the notebook view says the same first
    view.refresh()
    assert "failed: rank 1 failed first: RuntimeError" in view.table.value, view.table.value

    cli = [sys.executable, "-m", "workbench.cli", "job", "ddp-fails", "--store", str(store)]
    shown = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "rank 1 failed first: RuntimeError" in shown.stdout, shown.stdout + shown.stderr
    as_json = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60)
    found = json.loads(as_json.stdout)
    assert (found["status"], found["first_failed_rank"]) == ("failed", 1), found
    assert found["ranks"][1]["failure"]["where"].endswith(f"job.py:{line} in <module>"), found
