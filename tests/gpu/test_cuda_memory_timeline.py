"""The memory timeline and the op table on a real CUDA device (skipped without one).

The timeline is checked against figures it does not compute: the CUDA caching allocator's own
counters (`memory_allocated`, `max_memory_allocated`) over the very step the profiler recorded,
and the parameters' bytes counted from the model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.levers import build
from workbench.measure.memory_timeline import record_memory_timeline
from workbench.measure.profile import ProfileOptions
from workbench.trials import run_trial
from workbench.workloads import Workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def mlp_workload() -> Workload:
    return Workload.from_callables(
        model_fn=lambda: nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)),
        batch_fn=lambda n, g: (torch.randn(n, 512, generator=g), torch.randn(n, 512, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=256,
    )


def test_the_timeline_rises_as_much_as_the_allocator_saw_in_the_same_step() -> None:
    """What the step allocates on top of what was there before, by the timeline (its first sample
    holds the tensors that pre-existed) and by the allocator's counters around the same step."""
    step = build(mlp_workload(), TrainConfig(), "cuda")
    batches = iter(step.workload.batches(step.config))

    def one_step() -> None:
        step([step.prepare_batch(next(batches))])

    for _ in range(2):  # optimizer state and cuBLAS workspace exist before the recorded step
        one_step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    timeline = record_memory_timeline(one_step, torch.device("cuda"))
    torch.cuda.synchronize()
    allocator_rise = torch.cuda.max_memory_allocated() - before
    assert "error" not in timeline, timeline.get("error")
    timeline_rise = timeline["peak"]["total_bytes"] - timeline["total_bytes"][0]
    assert allocator_rise > 1 << 20  # activations of a 256x2048 hidden layer, gradients: megabytes
    assert timeline_rise == pytest.approx(allocator_rise, rel=0.02, abs=64 * 1024), (timeline_rise, allocator_rise)
    # The parameters at the peak are the model's own bytes (every size here is a multiple of 512).
    params = sum(p.numel() * p.element_size() for p in step.base_model.parameters())
    assert timeline["peak"]["categories"]["parameters"] == params


def test_memory_timeline_and_kernel_table_on_cuda(tmp_path: Path) -> None:
    workload = mlp_workload()
    options = ProfileOptions(wait=0, warmup=1, active=2, trace_dir=str(tmp_path), scan_syncs=False)
    result = run_trial(workload, TrainConfig(), warmup=2, steps=3, device="cuda", isolation="inline", profile=options)
    assert result.status == "ok", result.message
    timeline = result.profile["memory_timeline"]  # type: ignore[index]
    assert "error" not in timeline, timeline.get("error")
    assert timeline["device"].startswith("cuda:")
    assert [p["phase"] for p in timeline["phases"]] == ["data", "forward", "backward", "optimizer"]
    allocator_peak = result.peak_memory_bytes
    assert allocator_peak and 0.5 * allocator_peak <= timeline["peak"]["total_bytes"] <= 1.1 * allocator_peak
    kernels = result.profile["kernel_table"]  # type: ignore[index]
    assert kernels and all(k["calls_per_step"] > 0 for k in kernels)
    assert result.profile["step_timeline"]["lanes"][0] == "phases"  # type: ignore[index]
    assert any(lane.startswith("stream ") for lane in result.profile["step_timeline"]["lanes"])  # type: ignore[index]
