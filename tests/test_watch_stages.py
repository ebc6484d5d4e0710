"""Stage markers in a watched job's own Dataset reach its stored run: per step, from the loop or its workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from workbench.store import Store, schema
from workbench.store.watched import (
    StepRow,
    flush_watch_run,
    last_steps,
    start_watch_run,
    watch_steps,
    watched_runs,
)

ROOT = Path(__file__).resolve().parents[1]
SLEEP_MS = 15.0
BATCH = 2
STEPS = 8

JOB = """
import os, sys, time, torch
import workbench as wb

SLEEP_S, WORKERS, BATCH, STEPS = float(sys.argv[2]) / 1000, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
EPOCHS = 2


class Frames(torch.utils.data.Dataset):
    def __len__(self):
        return BATCH * STEPS // EPOCHS

    def __getitem__(self, index):
        with wb.stage("read"):
            raw = torch.full((16,), float(index))
            raw[1] = os.getpid()  # which process made it
        with wb.stage("decode"):
            time.sleep(SLEEP_S)  # the injected, known cost
        with wb.stage("transform"):
            return raw * 0.5


if __name__ == "__main__":
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        Frames(), batch_size=BATCH, num_workers=WORKERS, persistent_workers=WORKERS > 0
    )
    with wb.watch(model, opt, name="staged", store=sys.argv[1], flush_s=0.2, warmup=1) as w:
        seen, makers = [], set()
        for epoch in range(EPOCHS):
            for batch in w.batches(loader):
                seen.append(batch[0, 0].item())
                makers.add(batch[0, 1].item())
                loss = model(batch).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                w.step(loss=loss)
    # the loop got the user's own batches, in order, each epoch from the same (persistent) workers
    assert seen == [float(i * BATCH) * 0.5 for i in range(STEPS // EPOCHS)] * EPOCHS, seen
    assert len(makers) == 1, makers
    assert next(iter(loader)).shape == (BATCH, 16)  # the user's loader is left as it was
"""


def _run_job(tmp_path: Path, workers: int) -> Path:
    script, store_path = tmp_path / "job.py", tmp_path / "h.sqlite"
    script.write_text(textwrap.dedent(JOB))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(script), str(store_path), str(SLEEP_MS), str(workers), str(BATCH), str(STEPS)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return store_path


@pytest.mark.parametrize("workers", [0, 1])
def test_a_sleep_injected_in_one_stage_is_stored_against_that_stage(tmp_path: Path, workers: int) -> None:
    store_path = _run_job(tmp_path, workers)
    with Store(store_path) as store:
        (run,) = watched_runs(store)
        rows = watch_steps(store, run.run_id, recent=True)
        history = watch_steps(store, run.run_id)
    assert [r.first_step for r in rows] == list(range(1, STEPS + 1))
    injected = BATCH * SLEEP_MS  # per step: one batch of BATCH samples, each sleeping SLEEP_MS in decode
    for row in rows:
        assert row.stages is not None and set(row.stages) == {"read", "decode", "transform"}
        assert injected <= row.stages["decode"] <= injected + 10.0
        assert row.stages["decode"] >= 0.8 * sum(row.stages.values())  # attributed to its stage
        if workers == 0:  # prepared inside the wait: the data wait is mostly that one stage
            assert row.data_ms is not None and row.stages["decode"] >= 0.8 * row.data_ms
    assert sum(r.steps for r in history) == STEPS
    assert all(r.stages is not None and r.stages["decode"] >= injected for r in history)
    assert injected <= run.summary["steady_stages_ms"]["decode"] <= injected + 10.0


def test_a_job_whose_dataset_marks_nothing_stores_no_stages(tmp_path: Path) -> None:
    script, store_path = tmp_path / "plain.py", tmp_path / "h.sqlite"
    script.write_text(
        textwrap.dedent(
            """
            import sys, torch
            import workbench as wb

            model = torch.nn.Linear(4, 1)
            data = torch.utils.data.TensorDataset(torch.randn(8, 4))
            with wb.watch(model, name="plain", store=sys.argv[1], flush_s=0.2) as w:
                for (batch,) in w.batches(torch.utils.data.DataLoader(data, batch_size=2)):
                    model(batch).sum().backward()
                    w.step()
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), str(store_path)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    with Store(store_path) as store:
        (run,) = watched_runs(store)
        rows = watch_steps(store, run.run_id, recent=True)
    assert len(rows) == 4 and all(r.stages is None for r in rows)  # not measured, never 0
    assert run.summary["steady_stages_ms"] == {}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_store_from_before_the_stages_opens_keeps_its_steps_and_then_stores_stages(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    target = str(request.getfixturevalue("postgres_url")) if backend == "postgresql" else str(tmp_path / "h.sqlite")
    with monkeypatch.context() as patched:
        patched.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:5])  # the store as the previous release left it
        with Store(target) as old:
            run_id = start_watch_run(old, "old-job", config={}, environment={}, warmup=0, pid=os.getpid())
            with old._write() as conn:
                conn.execute(
                    "INSERT INTO watch_steps (run_id, recent, first_step, steps, wall_time, step_ms) "
                    "VALUES (?, 1, 1, 1, 0.0, 12.5)",
                    (run_id,),
                )
    with Store(target) as store:  # migrated on open
        (old_row,) = watch_steps(store, run_id, recent=True)
        assert (old_row.step_ms, old_row.stages) == (12.5, None)  # not measured then: no stages, not zeros
        stored = StepRow(2, 1, 1.0, step_ms=30.0, stages={"decode": 25.5, "read": 0.25})
        flush_watch_run(
            store, run_id, last_step=2, summary={}, history=[], replace_history=False, recent=[stored], recent_from=1
        )
        rows = watch_steps(store, run_id, recent=True)
        newest = last_steps(store, [run_id])
    assert [r.stages for r in rows] == [None, {"decode": 25.5, "read": 0.25}]
    assert newest[run_id] == stored


def test_a_jobs_ranks_say_their_data_stages_slowest_first() -> None:
    from workbench.store.watched import WatchedRun
    from workbench.watch.job import job_of

    ended: dict[str, Any] = {"name": "bev", "status": "ended", "message": "", "host": None, "pid": None}
    ended |= {"started_at": 0.0, "heartbeat_at": 0.0, "ended_at": 1.0, "last_step": 10, "warmup": 1}
    ended |= {"device_name": None, "commit": None, "dirty": False, "env_key": "", "environment": {}, "config": {}}

    def rank(index: int, summary: dict[str, Any]) -> WatchedRun:
        return WatchedRun(run_id=index + 1, summary=summary, rank=index, world_size=2, job="j1", **ended)

    job = job_of([rank(0, {"steady_stages_ms": {"read": 0.5, "decode": 31.0}}), rank(1, {})])
    assert job.ranks[0].stages_ms == {"read": 0.5, "decode": 31.0} and job.ranks[1].stages_ms == {}
    lines = job.describe().splitlines()
    staged = [line.strip() for line in lines if "data stages" in line]
    assert staged == ["data stages per step: decode 31.0 ms, read 0.5 ms"]  # rank 1 marked nothing: no line
    assert lines.index("    " + staged[0]) == 1 + next(i for i, line in enumerate(lines) if "rank 0:" in line)
    assert job.to_dict()["ranks"][0]["stages_ms"] == {"read": 0.5, "decode": 31.0}
