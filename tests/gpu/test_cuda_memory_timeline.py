"""The memory timeline and the op table on a real CUDA device (skipped without one).

Not yet run on a GPU when written: the bounds are deliberately loose (the profiled step's peak
against the allocator's peak over the timed window) and say what they check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.measure.memory_timeline import CATEGORIES
from workbench.measure.profile import ProfileOptions
from workbench.trials import run_trial
from workbench.workloads import Workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_memory_timeline_and_kernel_table_on_cuda(tmp_path: Path) -> None:
    workload = Workload.from_callables(
        model_fn=lambda: nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)),
        batch_fn=lambda n, g: (torch.randn(n, 512, generator=g), torch.randn(n, 512, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=256,
    )
    options = ProfileOptions(wait=0, warmup=1, active=2, trace_dir=str(tmp_path), scan_syncs=False)
    result = run_trial(workload, TrainConfig(), warmup=2, steps=3, device="cuda", isolation="inline", profile=options)
    assert result.status == "ok", result.message
    timeline = result.profile["memory_timeline"]  # type: ignore[index]
    assert "error" not in timeline, timeline.get("error")
    assert timeline["device"].startswith("cuda:")
    for i in range(len(timeline["t_ms"])):
        assert sum(timeline["categories"][c][i] for c in CATEGORIES) == timeline["total_bytes"][i]
    assert [p["phase"] for p in timeline["phases"]] == ["data", "forward", "backward", "optimizer"]
    allocator_peak = result.peak_memory_bytes
    assert allocator_peak and 0.5 * allocator_peak <= timeline["peak"]["total_bytes"] <= 1.1 * allocator_peak
    kernels = result.profile["kernel_table"]  # type: ignore[index]
    assert kernels and all(k["calls_per_step"] > 0 for k in kernels)
    assert result.profile["step_timeline"]["lanes"][0] == "phases"  # type: ignore[index]
    assert any(lane.startswith("stream ") for lane in result.profile["step_timeline"]["lanes"])  # type: ignore[index]
