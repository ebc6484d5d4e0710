"""NVML utilization and energy per step on a matmul loop of known length.

The truths: a loop of large bf16 matmuls keeps the GPU busy (NVML's utilization near 100%),
and the energy the counter reports over the recorded window matches the power readings of a
separate device monitor (NVML's instantaneous power, a different counter) integrated over the
same window. Skipped without CUDA; `scripts/gpu-check` runs these on a lent GPU machine.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.measure.monitor import DeviceMonitor
from workbench.trials import run_trial
from workbench.workloads import Workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SIZE = 8192
MATMULS = 40
"""About 45 TFLOP a step: ~60-100 ms on an H100/H200, longer on smaller GPUs."""


class MatmulLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)
        self.register_buffer("a", torch.randn(SIZE, SIZE, dtype=torch.bfloat16))
        self.register_buffer("out", torch.empty(SIZE, SIZE, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for _ in range(MATMULS):
                torch.mm(self.a, self.a, out=self.out)
        return self.linear(x)


def matmul_workload() -> Workload:
    return Workload.from_callables(
        model_fn=MatmulLoop,
        batch_fn=lambda n, g: (torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
        name="matmul-loop",
    )


def test_nvml_utilization_and_energy_per_step_on_a_matmul_loop() -> None:
    monitor = DeviceMonitor(rate_hz=20, history_s=120)
    if not monitor.gpu_status()[0]:
        pytest.skip(f"NVML is not usable here: {monitor.gpu_status()[1]}")
    with monitor:
        result = run_trial(matmul_workload(), TrainConfig(), steps=80, warmup=10, device="cuda",
                           track_memory=False, isolation="inline")  # fmt: skip
        time.sleep(1.0)  # the monitor's readings must cover the window's end (and half a second more)
    monitor.close()
    assert result.ok, result.message
    assert result.utilization is not None and result.energy is not None and result.timed_window is not None
    gpu = result.utilization["gpu"]
    assert gpu is not None, result.utilization["gpu_reason"]
    assert gpu["name"] == torch.cuda.get_device_name()
    assert gpu["util_pct"]["median"] >= 90.0
    assert gpu["sm_clock_mhz"]["median"] > 500.0
    assert gpu["mem_used_bytes"]["median"] >= 2 * SIZE * SIZE * 2  # at least the two bf16 buffers

    energy = result.energy
    assert energy["available"], energy.get("reason")
    start, end = result.timed_window
    assert end - start == pytest.approx(sum(result.step_ms) / 1000.0, rel=0.1)
    assert energy["per_step_j"] == pytest.approx(energy["joules"] / len(result.step_ms))
    assert energy["per_sample_j"] == pytest.approx(energy["per_step_j"] / result.samples_per_step)

    # Independent: the monitor's power readings integrated over the window. Depending on the
    # driver a reading is instantaneous or the last second's average: shifted by half a second,
    # either is off by at most ~0.5 s of a ~5 s window.
    index = gpu["nvml_index"]
    readings = [(s["t"], s["gpus"][index]["power_w"]) for s in monitor.samples()]
    inside = [w for t, w in readings if start + 0.5 <= t <= end + 0.5 and w is not None]
    assert end - start >= 3.0 and len(inside) >= 30
    monitor_joules = float(np.mean(inside)) * (end - start)
    assert energy["joules"] == pytest.approx(monitor_joules, rel=0.2)
    assert 50.0 <= energy["mean_power_w"] <= 1500.0


class IdlesThenLoops(MatmulLoop):
    """10 of the loop's matmuls a step (~15-30 ms on an H100/H200: short enough for the host-bound
    check to apply); the first (warm-up) step ends with the GPU idle for 1.5 s."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for _ in range(10):
                torch.mm(self.a, self.a, out=self.out)
        out = self.linear(x)
        self.calls += 1
        if self.calls == 1:
            torch.cuda.synchronize()
            time.sleep(1.5)
        return out


def test_a_short_window_after_idle_time_is_not_called_host_bound() -> None:
    """NVML's samples cover the period before their timestamp: a window of 6 busy steps (~0.1-0.2 s)
    right after 1.5 s of idling must not report the idle time as the window's. The truth is the
    workload itself: back-to-back 8192² bf16 matmuls keep the GPU busy throughout each step."""
    from workbench.analysis.diagnose import diagnose

    workload = Workload.from_callables(
        model_fn=IdlesThenLoops,
        batch_fn=lambda n, g: (torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
        name="idles-then-loops",
    )
    result = run_trial(workload, TrainConfig(), steps=6, warmup=1, device="cuda", track_memory=False,
                       isolation="inline")  # fmt: skip
    assert result.ok, result.message
    gpu = (result.utilization or {}).get("gpu")
    assert gpu is not None, (result.utilization or {}).get("gpu_reason")
    if gpu["util_pct"] is None:
        assert gpu["util_reason"].startswith("window too short for NVML's sampling"), gpu
    else:
        assert gpu["util_pct"]["median"] >= 90.0, gpu
    assert result.median_step_ms < 50.0  # short steps: where the diagnosis would call an idle GPU host-bound
    diagnosis = diagnose(result)
    assert not [f for f in diagnosis.findings if f.title == "GPU under-used: host-bound"], diagnosis.to_text()
