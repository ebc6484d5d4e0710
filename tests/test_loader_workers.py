"""DataLoader workers on a Dataset defined in the user's own script or notebook (`__main__`).

The class reaches the trial worker by value (cloudpickle), where `__main__` is not the user's
module; loader workers started by spawn or forkserver re-pickle the dataset with the standard
pickler and cannot find the class. Each test runs a real script in a real subprocess, so the
class truly lives in `__main__`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SLOW_DATASET = """
import time

import torch
from torch import nn

from workbench.workloads import Workload


class SlowDataset(torch.utils.data.Dataset):
    # Decoding stand-in: each sample waits, as a JPEG decode or an augmentation would.
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(0.006)
        return torch.randn(16), torch.tensor(index % 4)


workload = Workload.from_callables(
    model_fn=lambda: nn.Linear(16, 4),
    loss_fn=lambda output, batch: nn.functional.cross_entropy(output, batch[1]),
    dataset_fn=SlowDataset,
    collate_fn=lambda samples: torch.utils.data.default_collate(samples),
    batch_size=4,
)
"""


def run_script(tmp_path: Path, body: str, *args: str) -> str:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(SLOW_DATASET) + textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_STORE": "off"}
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_diagnose_apply_num_workers_is_faster_on_a_script_defined_dataset(tmp_path: Path) -> None:
    out = run_script(
        tmp_path,
        """
        import json

        from workbench.analysis.diagnose import diagnose
        from workbench.config import TrainConfig
        from workbench.trials import run_trial

        window = {"warmup": 2, "steps": 10}
        baseline = run_trial(workload, TrainConfig(), **window)
        finding = diagnose(baseline).primary
        fix = next(r for r in finding.recommendations if "num_workers" in r.changes)
        fixed = run_trial(workload, fix.apply(TrainConfig()), **window)
        print(json.dumps({
            "kind": finding.kind, "changes": fix.changes, "status": fixed.status, "message": fixed.message,
            "before": baseline.median_step_ms, "after": fixed.median_step_ms,
        }))
        """,
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report["kind"] == "data"
    assert report["changes"]["num_workers"] >= 1
    assert report["status"] == "ok", report["message"]
    # 4 samples x 6 ms = 24 ms of loading per step in the loop; two workers overlap it with compute.
    assert report["after"] < 0.8 * report["before"], report


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_loader_workers_started_by_spawn_rebuild_a_class_the_worker_got_by_value(
    tmp_path: Path, start_method: str
) -> None:
    """The trial worker's situation on macOS or Python >= 3.14: the workload arrived by cloudpickle
    in a process whose `__main__` lacks the class, and loader workers are not forked."""
    payload = tmp_path / "workload.pkl"
    run_script(
        tmp_path, "import cloudpickle, sys\nopen(sys.argv[1], 'wb').write(cloudpickle.dumps(workload))\n", str(payload)
    )
    loader = tmp_path / "load_in_another_main.py"
    loader.write_text(
        textwrap.dedent(
            """
            import sys

            import cloudpickle
            import torch

            from workbench.config import TrainConfig

            if __name__ == "__main__":
                torch.multiprocessing.set_start_method(sys.argv[1], force=True)
                workload = cloudpickle.loads(open(sys.argv[2], "rb").read())
                inputs, labels = next(iter(workload.make_loader(TrainConfig(num_workers=1))))
                print(tuple(inputs.shape), tuple(labels.shape))
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(loader), start_method, str(payload)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "(4, 16) (4,)"
