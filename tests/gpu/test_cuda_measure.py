"""Measurement on CUDA: event timing against a kernel of known length, no implicit sync, allocator peak.

Skipped without CUDA; `scripts/gpu-check` runs these on a lent GPU machine.
"""

from __future__ import annotations

import time

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

SPIN_CYCLES = 20_000_000


class Spinner(nn.Module):
    """Forward launches a GPU spin kernel of fixed length: a step with a known device time."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(SPIN_CYCLES)
        return self.linear(x)


def spinner_workload() -> Workload:
    return Workload.from_callables(
        model_fn=Spinner,
        batch_fn=lambda n, g: (torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
    )


def _spin_ms() -> float:
    """Independent truth: the spin kernel alone, host-timed around a synchronize, median of 5."""
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        torch.cuda._sleep(SPIN_CYCLES)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - begin) * 1000)
    return sorted(times)[2]


def test_event_timed_median_matches_a_kernel_of_known_length() -> None:
    expected = _spin_ms()
    result = run_trial(spinner_workload(), steps=10, warmup=2, device="cuda")
    assert result.status == "ok", result.message
    assert result.median_step_ms == pytest.approx(expected, rel=0.2)
    assert set(result.phase_ms) == {"data", "forward", "backward", "optimizer"}
    assert sum(v[0] for v in result.phase_ms.values()) == pytest.approx(result.step_ms[0], rel=0.05)


def test_timed_window_never_synchronizes_implicitly() -> None:
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = run_trial("bev-perception", TrainConfig(), steps=5, warmup=1, device="cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert result.status == "ok", result.message


def test_peak_memory_comes_from_the_allocator_and_covers_the_model_state() -> None:
    result = run_trial("bev-perception", TrainConfig(), steps=3, warmup=1, device="cuda")
    model = __import__("workbench.workloads", fromlist=["load_workload"]).load_workload("bev-perception").model_fn()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert result.peak_memory_bytes is not None
    assert result.peak_memory_bytes >= 4 * param_bytes  # params + grads + two AdamW moments
    assert "max_memory_allocated" in result.memory_method


@pytest.mark.parametrize(
    "overrides",
    [
        "amp=fp16",
        "amp=bf16,cuda_graphs=true",
        "amp=bf16,attention_backend=flash",
        "matmul_precision=high,optimizer_impl=fused",
    ],
)
def test_gpu_toggles_run_as_trials(overrides: str) -> None:
    workload = "driving-vlm" if "attention" in overrides else "bev-perception"
    result = run_trial(workload, TrainConfig().with_overrides(overrides), steps=5, warmup=3, device="cuda")
    assert result.status == "ok", result.message
    assert result.losses[-1] < result.losses[0] * 1.5
