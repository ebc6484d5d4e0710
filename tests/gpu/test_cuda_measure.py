"""Measurement on CUDA: event timing against a kernel of known length, no implicit sync, allocator peak.

Skipped without CUDA; `scripts/gpu-check` runs these on a lent GPU machine.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.measure import StepMeasured, TrialFinished, TrialRequest, TrialResult
from workbench.measure.trial import run_trial_inline
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


class SyncErrorsInTimedWindow:
    """An event sink that turns CUDA sync-debug mode to 'error' for the timed window only.

    The mode is per process, so the trial must run inline here (a spawned worker never sees
    it); warm-up is left out, because building the model copies weights with blocking copies.
    It turns on at the last warm-up step's event and off at the last timed step's, which
    arrives after the window's one deliberate `torch.cuda.synchronize` (not a checked op).
    """

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps

    def __call__(self, event: object) -> None:
        last_warmup = isinstance(event, StepMeasured) and not event.timed and event.step == self.warmup - 1
        last_timed = isinstance(event, StepMeasured) and event.step == self.warmup + self.steps - 1
        if last_warmup:
            torch.cuda.set_sync_debug_mode("error")
        elif last_timed or isinstance(event, TrialFinished):
            torch.cuda.set_sync_debug_mode("default")


def _inline_trial(workload: Workload | str, config: TrainConfig, warmup: int = 2, steps: int = 5) -> TrialResult:
    try:
        request = TrialRequest(workload, config, warmup=warmup, steps=steps, device="cuda", isolation="inline")
        return run_trial_inline(request, on_event=SyncErrorsInTimedWindow(warmup, steps))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("pin_memory", [False, True])
def test_timed_window_never_synchronizes_implicitly(pin_memory: bool) -> None:
    result = _inline_trial("bev-perception", TrainConfig(pin_memory=pin_memory))
    assert result.status == "ok", result.message
    assert len(result.step_ms) == 5


class ReadsALossValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        if out.mean().item() > 1e9:  # a host read of a device value: syncs every step
            out = out * 0
        return out


def test_the_timed_window_check_catches_a_sync() -> None:
    """The check above can fail: a model that calls .item() ends in the sync-debug error."""
    workload = Workload.from_callables(
        model_fn=ReadsALossValue,
        batch_fn=lambda n, g: (torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
    )
    result = _inline_trial(workload, TrainConfig())
    assert result.status == "error" and "synchronizing CUDA operation" in result.message


class CopiesAConstantIn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = torch.full((1,), 0.5).to(x.device)  # blocking host→device copy
        return self.linear(x) + bias


def test_sync_scan_names_a_blocking_host_to_device_copy_and_not_the_batch_copy() -> None:
    from workbench.levers import build
    from workbench.measure.syncscan import scan_syncs

    workload = Workload.from_callables(
        model_fn=CopiesAConstantIn,
        batch_fn=lambda n, g: (torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
    )
    step = build(workload, TrainConfig(), "cuda")
    batches = iter(workload.batches(TrainConfig()))
    found = scan_syncs(lambda: step([step.prepare_batch(next(batches))]), "cuda")
    copies = [site for site in found["sites"] if "host→device" in site["op"]]
    assert len(copies) == 1 and "torch.full((1,), 0.5).to(x.device)" in copies[0]["code"], found


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


class Activations(nn.Module):
    """Holds ~64 MiB of activations for backward: a peak the model state alone cannot explain."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(8)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_a_cuda_graph_trial_counts_the_memory_its_capture_allocated() -> None:
    """Replays allocate nothing: a peak reset after warm-up would miss the graph's private pool
    and show cuda_graphs as a memory saving. The eager trial is the independent truth."""
    workload = Workload.from_callables(
        model_fn=Activations,
        batch_fn=lambda n, g: (torch.randn(n, 1024, generator=g), torch.randn(n, 1024, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=2048,
    )
    eager = run_trial(workload, TrainConfig(), steps=3, device="cuda")
    graphed = run_trial(workload, TrainConfig(cuda_graphs=True), steps=3, device="cuda")
    assert eager.ok and graphed.ok, (eager.message, graphed.message)
    assert graphed.peak_memory_bytes >= 0.8 * eager.peak_memory_bytes, (
        graphed.peak_memory_bytes,
        eager.peak_memory_bytes,
    )
    assert "capture" in graphed.memory_method


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_trial_on_the_second_gpu_captures_and_times_there() -> None:
    """cuda:1 must be the current device for the whole trial (graph capture stream, synchronize)."""
    result = run_trial(spinner_workload(), TrainConfig(cuda_graphs=True), steps=5, device="cuda:1")
    assert result.ok, result.message
    assert result.median_step_ms == pytest.approx(_spin_ms(), rel=0.25)
