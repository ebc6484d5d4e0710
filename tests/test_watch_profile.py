"""A profiled window on demand in a watched loop whose loader is slowed on purpose: asked for by the
job (`w.profile`) and from outside it (`wb.watch.profile_job`, through the run history), the window
is diagnosed as a trial is and the diagnosis names the data loading; the job never stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import workbench as wb
from workbench.store import Store
from workbench.store.watched import watched_runs

ROOT = Path(__file__).resolve().parents[1]


def slow_loader(n: int, sleep_s: float = 0.03):
    for _ in range(n):
        time.sleep(sleep_s)  # the injected bottleneck: a loader 30x slower than the step's compute
        yield torch_batch()


def torch_batch():
    import torch

    return torch.randn(32, 64)


def test_a_window_asked_for_by_the_job_names_the_slow_loader(tmp_path: Path) -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    store = tmp_path / "history.sqlite"
    with wb.watch(model, opt, name="slow-data", store=store, flush_s=0.2, warmup=2) as w:
        for i, batch in enumerate(w.batches(slow_loader(30))):
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            w.step()
            if i == 10:
                w.profile(steps=4)
    assert w.steps == 30, "the job ran every step"
    window = w.last_profile
    assert window is not None and (window.first_step, window.last_step) == (14, 17)  # one start-up step first
    assert window.diagnosis is not None and window.diagnosis.primary is not None
    assert window.diagnosis.primary.kind == "data", window.diagnosis.to_text()
    assert window.profile["active_steps"] == 4 and window.profile["phase_share"]["data"] > 0.5
    stored = wb.watch.watch_windows("slow-data", store=store)
    assert [s.status for s in stored] == ["done"] and stored[0].diagnosis["primary"] == "data"


def test_misuse_of_profile_warns_once_and_the_loop_goes_on(tmp_path: Path) -> None:
    import torch

    model = torch.nn.Linear(4, 1)
    with warnings.catch_warnings(record=True) as caught, wb.watch(model, store=None, warmup=0) as w:
        warnings.simplefilter("always")
        for _ in range(6):
            model(torch.randn(2, 4)).sum().backward()
            w.profile(steps=0)
            w.step()
        w.profile(steps=2)
        w.profile(steps=2)  # a window is already pending
    messages = [str(c.message) for c in caught if issubclass(c.category, wb.watch.WatchWarning)]
    assert sum("steps must be a whole number" in m for m in messages) == 1
    assert sum("one at a time" in m for m in messages) == 1 and w.steps == 6


JOB = """
import signal, sys, time, torch
import workbench as wb
# Ctrl-C from the test raises KeyboardInterrupt here even when the suite runs in the background
# (`cmd &` starts it, and so this job, with SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def loader():
    while True:
        time.sleep(0.03)
        yield torch.randn(32, 64)

with wb.watch(model, opt, name="terminal-job", store=sys.argv[1], flush_s=0.2, warmup=2) as w:
    for step, batch in zip(range(int(sys.argv[2])), w.batches(loader())):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        w.step()
"""


def test_a_window_asked_for_from_outside_the_job_is_taken_run_and_stored(tmp_path: Path) -> None:
    store = tmp_path / "history.sqlite"
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen([sys.executable, str(tmp_path / "job.py"), str(store), "400"], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if store.exists():
                with Store(store) as db:
                    runs = watched_runs(db)
                if runs and runs[0].last_step >= 5:
                    break
            time.sleep(0.2)
        else:
            pytest.fail("the job never wrote a step")
        view = wb.ui.Watch("terminal-job", store=store, start=False)  # the notebook view's button asks
        view.profile_button.click()
        assert "asked (1 run(s))" in view.profile_note.value
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            windows = wb.watch.watch_windows("terminal-job", store=store)
            if windows and windows[0].status in ("done", "failed"):
                break
            time.sleep(0.2)
        assert job.poll() is None, "the job is still training: profiling never stopped it"
    finally:
        job.send_signal(signal.SIGINT)  # Ctrl-C: the watch leaves its context and marks the run ended
        job.wait(timeout=30)
    (window,) = windows
    assert window.status == "done", window.message
    assert window.diagnosis["primary"] == "data" and window.last_step - window.first_step == 4  # the button's 5
    view.refresh()
    assert "Data loading bound" in view.windows.value and "num_workers" not in view.profile_note.value
    with pytest.raises(LookupError, match="no running watched job"):
        wb.watch.profile_job("terminal-job", store=store)  # the job is gone: nobody would take it
