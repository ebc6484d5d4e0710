"""The straggler in a watched torchrun job, on real gloo ranks: a fixed delay in one rank's data loading,
forward, backward or optimizer step names that rank and that phase (2 and 3 ranks, the fault on rank 0 and
on another rank), from what each rank's `wb.watch` sees on its own; a job with no fault names none, also
beside CPU burners. One launch runs every job of a world size one after another (each its own watch)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from straggler_workload import PHASES

import workbench as wb
from workbench.jupyter.sources import list_watched

ROOT = Path(__file__).resolve().parents[1]
DELAY_S = 0.03

JOB = """
import sys, time, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[3])
import workbench as wb
from workbench.jupyter.sources import list_watched
from straggler_workload import FaultyNet

dist.init_process_group("gloo")
rank = dist.get_rank()
store, delay = sys.argv[1], float(sys.argv[2])
for spec in sys.argv[4:]:
    phase, slow, *flags = spec.split(":")
    slowed = rank == int(slow)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(FaultyNet(phase, int(slow), delay, norm="norm" in flags))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loader(n):
        for _ in range(n):
            if phase == "data" and slowed:
                time.sleep(delay)
            yield torch.randn(64, 64)

    with wb.watch(model, opt, name="-".join([phase, slow, *flags]), store=store, warmup=3, flush_s=0.2) as w:
        if phase == "optimizer" and slowed:  # after the watch's own hook: inside the optimizer phase
            opt.register_step_pre_hook(lambda *_: time.sleep(delay))
        for batch in w.batches(loader(24)):
            loss = model(batch).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss=loss)
    dist.barrier()
dist.destroy_process_group()
"""


def launch(tmp_path: Path, world: int, specs: list[str]) -> Path:
    store = tmp_path / "history.db"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "RANK": "", "WORLD_SIZE": ""}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    command += [str(script), str(store), str(DELAY_S), str(Path(__file__).parent), *specs]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return store


CASES = {
    2: [("data", 1), ("forward", 0), ("backward", 0), ("optimizer", 1)],
    3: [("data", 0), ("forward", 1), ("backward", 2), ("optimizer", 0)],
}


@pytest.mark.parametrize("world", [2, 3])
def test_a_delayed_phase_on_one_rank_is_named_with_that_phase_and_a_quiet_job_is_not(
    tmp_path: Path, world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert {phase for phase, _ in CASES[world]} == set(PHASES)
    store = launch(tmp_path, world, [f"{p}:{r}" for p, r in CASES[world]] + ["none:0", "data:0:norm"])
    for phase, slow in CASES[world]:
        job = wb.watch.watched_job(f"{phase}-{slow}", store=store)
        check = job.check
        assert check is not None and job.straggler == slow and check.cause == phase, job.describe()
        assert 0.8 * DELAY_S * 1000 <= check.late_ms <= 1.5 * DELAY_S * 1000, job.describe()
        assert check.others_wait_ms is not None and check.others_wait_ms >= 0.8 * DELAY_S * 1000
        assert f"straggler: rank {slow}" in job.describe() and f"rank {slow} arrives" in job.describe()
    # BatchNorm buffers: DDP broadcasts them as each forward begins, and there the others wait for rank 0
    buffered = wb.watch.watched_job("data-0-norm", store=store)
    assert buffered.straggler == 0 and buffered.check is not None and buffered.check.cause == "data", (
        buffered.describe()
    )
    quiet = wb.watch.watched_job("none-0", store=store)
    assert quiet.check is not None and quiet.straggler is None, quiet.describe()
    if world == 2:  # the JupyterLab panel's feed says the same, once per launch, for every rank listed
        monkeypatch.setenv("WORKBENCH_STORE", str(store))
        fed = [job for job in list_watched(limit=50)["jobs"] if job["name"] == "data-1"]
        assert sorted(job["rank"] for job in fed) == [0, 1]
        assert all(job["launch"]["straggler"] == 1 for job in fed)
        assert fed[0]["launch"]["pace"].startswith("straggler: rank 1 (data loading) — rank 1 arrives")


@pytest.fixture
def two_burners() -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_quiet_job_beside_cpu_burners_names_no_straggler(tmp_path: Path, two_burners: None) -> None:
    store = launch(tmp_path, 2, ["none:0", "none:1"])
    for name in ("none-0", "none-1"):
        job = wb.watch.watched_job(name, store=store)
        assert job.check is not None and job.straggler is None, job.describe()
