"""NVTX ranges on a real CUDA device: every step and phase of a trial's window is pushed and popped.

Skipped without CUDA; `scripts/gpu-check` runs it on a lent GPU machine. The real
torch.cuda.nvtx functions are called (wrapped to record the names), so a binding that fails on
this CUDA build fails here.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.trials import run_trial
from workbench.workloads import Workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_each_step_and_phase_is_an_nvtx_range_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    pushed: list[str] = []
    depth = [0]
    real_push, real_pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

    def push(name: str) -> int:
        pushed.append(name)
        depth[0] += 1
        return int(real_push(name))

    def pop() -> int:
        depth[0] -= 1
        return int(real_pop())

    monkeypatch.setattr(torch.cuda.nvtx, "range_push", push)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", pop)
    workload = Workload.from_callables(
        model_fn=lambda: nn.Linear(64, 1),
        batch_fn=lambda n, g: (torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
    )
    result = run_trial(workload, TrainConfig(), warmup=1, steps=3, device="cuda", isolation="inline")
    assert result.status == "ok", result.message
    assert depth[0] == 0
    steps = [name for name in pushed if name.startswith("workbench::step ")]
    assert steps == [f"workbench::step {i}" for i in range(4)]
    per_step = pushed[: pushed.index("workbench::step 1")]
    assert per_step == ["workbench::step 0", "workbench::data", "workbench::forward", "workbench::backward",
                        "workbench::optimizer"]  # fmt: skip
