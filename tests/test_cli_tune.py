"""`workbench tune` as a user runs it: a real subprocess, its `--json` fields, one-line errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "workbench.cli", "tune"]

SLEEPY_MODULE = """
import time
import torch
from torch import nn
from workbench.workloads import Workload

class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x):
        time.sleep(0.004 + 0.0005 * x.shape[0])  # per sample, batch 8 is 1.5x batch 4's throughput
        return self.linear(x)

def sleepy(preset="tiny"):
    return Workload.from_callables(
        model_fn=Sleepy,
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4, name="sleepy",
    )
"""


def tune(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.mark.parametrize(
    ("args", "space", "message"),
    [
        ([], "{}", "search space is empty"),
        ([], '{"num_workers": [0], "prefetch_factor": [2, 4]}', "contradictory"),
        ([], '{"amp": ["fp32", "bf16"]', "not JSON"),
        (["--budget", "5s"], '{"amp": ["fp32", "bf16"]}', "too small for even one round"),
        (["--budget", "soon"], '{"amp": ["fp32", "bf16"]}', "not a duration"),
        (["--max-memory", "1KiB"], '{"amp": ["fp32", "bf16"]}', "below the model's parameters"),
        (["--objective", "step-time"], '{"batch_size": [4, 8]}', "cannot rank different batch sizes"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], space: str, message: str
) -> None:
    """In-process (`cli.main`, as the console script calls it): every refusal comes before a trial."""
    from workbench.cli import main

    (tmp_path / "space.json").write_text(space)
    code = main(["tune", "--space", str(tmp_path / "space.json"), "--device", "cpu", "--no-store", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_tune_json_has_best_trials_pareto_and_budget(tmp_path: Path) -> None:
    (tmp_path / "sleepy_models.py").write_text(SLEEPY_MODULE)
    (tmp_path / "space.json").write_text('{"batch_size": [4, 8]}')
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = tune("--workload", "sleepy_models:sleepy", "--space", str(tmp_path / "space.json"), "--budget", "40",
                "--steps", "4", "--warmup", "1", "--device", "cpu", "--precision", "0.1",
                "--store", str(tmp_path / "h.sqlite"), "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    best = data["best"]
    assert best["config"]["batch_size"] == 8 and best["speedup"] > 1.3 and len(best["speedup_ci"]) == 2
    for trial in data["trials"]:
        assert {"config", "status", "median_step_ms", "peak_memory_bytes"} <= set(trial)
    assert data["pareto"] and all(p["status"] == "ok" for p in data["pareto"])
    assert data["budget_used_s"] <= data["budget_s"] * 1.5
    assert data["objective"]["kind"] == "throughput"
