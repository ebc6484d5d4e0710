"""A compiled distributed trial (torchrun, 2 ranks on gloo) returns rank 0's compile report.

Each rank compiles the same model alike; the truths are the model's one explicit break (its line
found with `inspect`) and `torch._dynamo.explain`'s break count on the same model in this process.
The trial compiles the DDP wrapper, whose own forward breaks too (torch 2.13: a logger call and a
skipped context manager in `_pre_forward`): those are reported as DDP's, apart from the user's. backend='eager' keeps the ranks' compile to dynamo's capture (seconds).
"""

from __future__ import annotations

import inspect
import os

import compiled_workload
import torch

from workbench.config import TrainConfig
from workbench.trials import run_trial
from workbench.workloads import Workload


def test_a_two_rank_compiled_trial_reports_rank_zeros_breaks() -> None:
    workload = Workload.from_callables(
        compiled_workload.BreakingNormGelu, compiled_workload._loss, batch_fn=compiled_workload._batch, batch_size=8
    )
    config = TrainConfig(strategy="ddp", nproc_per_node=2, compile="default", compile_backend="eager")
    result = run_trial(workload, config, warmup=2, steps=3, device="cpu", timeout_s=240)
    assert result.ok, result.message
    report = result.compile_report or {}
    assert report.get("available"), report
    torch._dynamo.reset()
    explained = torch._dynamo.explain(compiled_workload.BreakingNormGelu())(torch.randn(4, 8))
    torch._dynamo.reset()
    torch_dir = os.path.dirname(torch.__file__)
    ddp = os.path.join(torch_dir, "nn", "parallel", "distributed.py")
    users = [b for b in report["breaks"] if "compiled_workload.py" in b["where"]]
    assert len(users) == explained.graph_break_count == 1
    lines, first = inspect.getsourcelines(compiled_workload.BreakingNormGelu)
    line = first + next(i for i, text in enumerate(lines) if "graph_break()" in text)
    assert users[0]["where"] == f"{compiled_workload.__file__}:{line}"
    # The others are DDP's own: in its file, or (a frame dynamo compiled on its own) naming it.
    others = [b for b in report["breaks"] if b not in users]
    assert all(b["where"].startswith(ddp) or "DistributedDataParallel" in b["explanation"] for b in others), others
    assert report["recompiles"] == []  # a fixed batch: no guard fails
