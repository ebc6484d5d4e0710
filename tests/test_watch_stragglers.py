"""The straggler in a watched torchrun job, on real gloo ranks: a fixed delay in one rank's data loading,
forward, backward or optimizer step names that rank and that phase (2 and 3 ranks, the fault on rank 0 and
on another rank), from what each rank's `wb.watch` sees on its own; a job with no fault names none, also
beside CPU burners. One launch runs every job of a world size one after another (each its own watch)."""

from __future__ import annotations

from pathlib import Path

import pytest
from straggler_workload import PHASES, cpu_burners, launch_watched

import workbench as wb
from workbench.jupyter.sources import list_watched

DELAY_S = 0.03


def launch(tmp_path: Path, world: int, specs: list[str]) -> Path:
    """Each spec `phase:slow[:norm]` with the test's delay."""
    timed = [":".join([*spec.split(":")[:2], str(DELAY_S), *spec.split(":")[2:]]) for spec in specs]
    return launch_watched(tmp_path, world, timed)


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


def test_a_quiet_job_beside_cpu_burners_names_no_straggler(tmp_path: Path) -> None:
    with cpu_burners(2):
        store = launch(tmp_path, 2, ["none:0", "none:1"])
    for name in ("none-0", "none-1"):
        job = wb.watch.watched_job(name, store=store)
        assert job.check is not None and job.straggler is None, job.describe()
