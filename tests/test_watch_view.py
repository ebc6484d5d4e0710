"""wb.ui.Watch: a watched job's live view in a notebook, read from what a real job (its own process)
wrote: the step line grows while the job runs, the data wait is the loader's sleep, and a name
with no job is said in the view, never raised into the notebook."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import workbench as wb

ROOT = Path(__file__).resolve().parents[1]

JOB = """
import sys, time, torch
import workbench as wb

model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def loader(n):
    for _ in range(n):
        time.sleep(0.03)  # the loader's wait, seen as data wait
        yield torch.randn(8, 16)

with wb.watch(model, opt, name="viewed", store=sys.argv[1], flush_s=0.2, warmup=2) as w:
    for batch in w.batches(loader(int(sys.argv[2]))):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        w.step()
"""


def test_the_view_follows_a_running_job_and_shows_its_data_wait(tmp_path: Path) -> None:
    store = tmp_path / "history.sqlite"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(store), "120"], env=env)
    view = wb.ui.Watch("viewed", store=store, interval_s=0.2)
    try:
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            with view._lock:
                if view.steps.data["xs"]:
                    seen.append(len(view.steps.data["xs"][0]))
        assert proc.wait(timeout=60) == 0
    finally:
        view.close()
    growing = [n for n in seen if n]
    assert len(set(growing)) >= 3 and growing == sorted(growing), f"the step line did not grow live: {seen}"

    view = wb.ui.Watch("viewed", store=store, start=False)
    view.refresh()
    (run,) = view.runs
    assert run.status == "ended" and view.steps.data["label"] == [f"run {run.run_id}"]
    assert max(view.steps.data["xs"][0]) == 120
    waits = view.waits.data["ys"][0][1:-1]
    assert 25 <= sorted(waits)[len(waits) // 2] <= 150, "the median data wait is the loader's 30 ms sleep"
    assert "ended" in view.table.value and "ms" in view.table.value


def test_a_name_without_a_job_is_said_in_the_view(tmp_path: Path) -> None:
    view = wb.ui.Watch("nothing-yet", store=tmp_path / "absent.sqlite", start=False)
    view.refresh()
    assert view.runs == [] and "to write its first step" in view.table.value and "nothing-yet" in view.table.value
    assert not (tmp_path / "absent.sqlite").exists(), "viewing never creates a store"
