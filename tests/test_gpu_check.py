"""scripts/gpu-check's runner: time caps, parallel and timed phases, the budget, the folder it writes;
and the whole check's dry run on this CPU. The truths are the clock and the processes themselves
(a section's child that outlives its cap must be gone; two parallel sleeps take one sleep's time)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_a_section_that_runs_out_or_fails_says_so_and_the_next_one_runs(tmp_path: Path) -> None:
    check = gpu_check()
    witness = tmp_path / "outlived-its-cap"
    # A section whose child process would write the witness 4 s after the section's 1 s cap.
    late_child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', \"import time, pathlib; time.sleep(4); pathlib.Path({str(witness)!r}).write_text('x')\"]); time.sleep(60)"
    plan = [
        check.Section("hangs", 1, "timed", python(late_child)),
        check.Section("fails", 10, "timed", python("import sys; print('boom'); sys.exit(3)")),
        check.Section("figures", 10, "timed", python("print('table'); print('key: 42 widgets')")),
    ]
    lines: list[str] = []
    status = check.Check(tmp_path / "out", dry_run=False, budget_s=60, say=lines.append).run(plan)
    hangs, fails, figures = json.loads((tmp_path / "out" / "summary.json").read_text())["sections"]
    assert status == 1
    assert hangs["status"] == "ran out at the 1 s cap" and 1 <= hangs["seconds"] < 8
    assert fails["status"] == "failed (exit 3)" and fails["key"] == "boom"
    assert figures["status"] == "ok" and figures["key"] == "42 widgets"
    time.sleep(5)
    assert not witness.exists(), "the section's child process outlived the cap"
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "ran out at the 1 s cap" in summary and "42 widgets" in summary
    assert any("(cap 1 s)" in line for line in lines)
    assert len(list((tmp_path / "out").glob("*.log"))) == 3


def test_parallel_sections_run_together_and_timed_ones_after_them(tmp_path: Path) -> None:
    check = gpu_check()
    stamp = "import time; print('key:', time.time())"
    plan = [
        check.Section("timed", 10, "timed", python(stamp)),
        check.Section("a", 10, "parallel", python(f"import time; time.sleep(2); {stamp}")),
        check.Section("b", 10, "parallel", python(f"import time; time.sleep(2); {stamp}")),
    ]
    began = time.time()
    assert check.Check(tmp_path, dry_run=False, budget_s=60, say=lambda _: None).run(plan) == 0
    ended = {s["name"]: float(s["key"]) for s in json.loads((tmp_path / "summary.json").read_text())["sections"]}
    assert max(ended["a"], ended["b"]) - began < 3.9  # two 2 s sleeps side by side, not one after the other
    assert ended["timed"] > max(ended["a"], ended["b"])  # the timed section waits for the parallel phase


def test_the_budget_caps_sections_and_skips_those_it_cannot_start(tmp_path: Path) -> None:
    check = gpu_check()
    plan = [
        check.Section("long", 30, "timed", python("import time; time.sleep(30)")),
        check.Section("after", 30, "timed", python("print('key: never')")),
    ]
    status = check.Check(tmp_path, dry_run=False, budget_s=7, say=lambda _: None).run(plan)
    long, after = json.loads((tmp_path / "summary.json").read_text())["sections"]
    assert status == 1
    assert long["status"] == "ran out at the 7 s cap" and long["seconds"] < 14
    assert after["status"].startswith("skipped: the check's 7 s budget is spent")


def test_a_failed_preflight_stops_the_check(tmp_path: Path) -> None:
    check = gpu_check()
    plan = [
        check.Section("preflight", 10, "setup", python("raise SystemExit(1)"), required=True),
        check.Section("later", 10, "timed", python("print('key: ran')")),
    ]
    assert check.Check(tmp_path, dry_run=False, budget_s=30, say=lambda _: None).run(plan) == 1
    statuses = [s["status"] for s in json.loads((tmp_path / "summary.json").read_text())["sections"]]
    assert statuses == ["failed (exit 1)", "skipped: not started"]


@pytest.mark.slow
def test_the_dry_run_names_every_section_with_its_cap_and_runs_the_cpu_paths(tmp_path: Path) -> None:
    """The real `scripts/gpu-check --dry-run` (about a minute here): what the GPU machine will run,
    minus what needs a GPU; the external timer and MFU run their CPU code paths on tiny presets."""
    out = tmp_path / "logs"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    plan = gpu_check().sections()
    for section in plan:
        assert f"{section.name} (cap {section.cap_s:.0f} s)" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and [s["name"] for s in summary["sections"]] == [s.name for s in plan]
    by_name = {s["name"]: s for s in summary["sections"]}
    timer = by_name["external timer vs workbench run (base presets, fp32/bf16)"]
    mfu = by_name["MFU of driving-vlm base bf16 (eager, compiled)"]
    assert timer["status"] == "ok" and "CPU dry run" in timer["key"] and "time ratio" in timer["key"]
    assert mfu["status"] == "ok" and "CPU dry run" in mfu["key"]
    assert "bev-perception   bf16" in Path(timer["log"]).read_text()
    assert "GFLOP/step" in Path(mfu["log"]).read_text()
    assert "collected" in by_name["GPU tests (1 of 2)"]["key"]
    assert "== summary" in done.stdout and (out / "summary.txt").exists()
