"""From a watched job to a measured A/B: a real loop on a slow dataset is watched, then reproduced in
the workbench with the same model and data; the diagnosis names the data loading, its loader
recommendation is measured by the protocol against the job's own configuration, and wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SLOW_JOB = """
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
        sample = torch.randn(16, generator=torch.Generator().manual_seed(index))  # the same in any worker
        return sample, torch.tensor(index % 4)


def collate(samples):
    return torch.utils.data.default_collate(samples)


workload = Workload.from_callables(
    model_fn=lambda: nn.Linear(16, 4), loss_fn=lambda output, batch: nn.functional.cross_entropy(output, batch[1]),
    dataset_fn=SlowDataset, collate_fn=collate, batch_size=4,
)
"""

MAIN = """
import json, sys
import torch
import workbench as wb
from slow_job import SlowDataset, collate

store = sys.argv[1]
model = torch.nn.Linear(16, 4)
opt = torch.optim.AdamW(model.parameters())
loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=4, collate_fn=collate)  # the job's own loop
with wb.watch(model, opt, name="slow-job", store=store, config=wb.TrainConfig(), flush_s=0.2) as w:
    for i, (x, y) in enumerate(w.batches(loader)):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        w.step()
        if i == 30:
            break

found = wb.watch.reproduce("slow-job", "slow_job:workload", store=store, steps=6, warmup=1,
                           protocol=wb.Protocol(budget_s=10, confidence=0.8, min_rounds=4),  # 4 rounds, not 6:
                           max_candidates=2)  # the data finding's two; workers win by far, an 80% interval shows it
print(json.dumps({
    "primary": found.diagnosis.primary.kind if found.diagnosis.primary else None,
    "candidates": [c.to_dict() for c in found.candidates],
    "winner": found.winner_config.to_dict(),
    "verdicts": [(row.verdict, row.numerics.ok) for row in found.run.comparison.candidates],
    "snippet": wb.export(found.winner_config, "snippet"),
    "text": found.describe(),
}))
"""


def test_a_watched_slow_loader_is_reproduced_and_its_fix_measured(tmp_path: Path) -> None:
    (tmp_path / "slow_job.py").write_text(textwrap.dedent(SLOW_JOB))
    (tmp_path / "main.py").write_text(textwrap.dedent(MAIN))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "main.py", str(tmp_path / "history.sqlite")], capture_output=True,
                          text=True, timeout=400, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["primary"] == "data", out["text"]
    assert any(c["num_workers"] > 0 for c in out["candidates"]), out["text"]
    assert out["winner"]["num_workers"] > 0, out  # 6 ms a sample in the main process: workers win by far
    assert "num_workers" in out["snippet"] and "slow-job" in out["text"]
