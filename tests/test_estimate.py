"""Memory estimates: fake-tensor figures against real tracked peaks, the CUDA rounding model, batch search."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.estimate import (
    CUBLAS_WORKSPACE_HOPPER,
    cuda_block_bytes,
    cuda_workspace_bytes,
    estimate_memory,
    max_batch_size,
)
from workbench.trials import run_trial
from workbench.workloads import Workload, builtin_workloads


@pytest.mark.parametrize("checkpointing", ["off", "full"])
@pytest.mark.parametrize("name", sorted(builtin_workloads()))
def test_estimate_matches_the_real_tracked_peak_within_5_percent(name: str, checkpointing: str) -> None:
    config = TrainConfig(activation_checkpointing=checkpointing)
    real = run_trial(name, config, warmup=1, steps=1, isolation="inline")
    assert real.status == "ok" and real.peak_memory_bytes, real.message
    estimate = estimate_memory(name, config, "cpu")
    assert estimate.peak_bytes == pytest.approx(real.peak_memory_bytes, rel=0.05)
    assert estimate.breakdown["activations"] > 0 and estimate.breakdown["optimizer_state"] > 0
    assert estimate.modules  # the same tracker splits the peak by module


def test_cuda_caching_allocator_rounds_every_block_to_512_bytes() -> None:
    assert [cuda_block_bytes(n) for n in (0, 1, 511, 512, 513, 1 << 20)] == [0, 512, 512, 512, 1024, 1 << 20]
    assert cuda_workspace_bytes("NVIDIA H200") == 2 * CUBLAS_WORKSPACE_HOPPER
    assert cuda_workspace_bytes("NVIDIA A100-SXM4-80GB") < cuda_workspace_bytes("NVIDIA H100 80GB HBM3")


MIB = 1 << 20


@pytest.mark.parametrize(
    ("nbytes", "counted"),
    [
        (5 * MIB, 5 * MIB),  # from a shared 20 MiB segment: split, 512-byte exact
        (10 * MIB, 10 * MIB),  # its own 10 MiB segment, nothing left over
        (10 * MIB + 1, 10 * MIB + 512),  # 12 MiB segment, 2 MiB - 512 B left (> 1 MiB): split
        (11 * MIB, 12 * MIB),  # exactly 1 MiB left: not split, the whole segment counts
        (11 * MIB + 1, 12 * MIB),  # < 1 MiB left: not split
        (101 * MIB + 4096, 102 * MIB),
        (103 * MIB - 4096, 103 * MIB - 4096),  # rounds to 104 MiB, > 1 MiB left: split
    ],
)
def test_large_segments_are_not_split_when_at_most_1_mib_would_remain(nbytes: int, counted: int) -> None:
    # The allocator's should_split: a large-pool remainder is split off only when > kSmallSize (1 MiB).
    assert cuda_block_bytes(nbytes, expandable_segments=False) == counted
    # Expandable segments split down to 512 bytes.
    assert cuda_block_bytes(nbytes, expandable_segments=True) == -(-nbytes // 512) * 512


def test_alloc_conf_and_cublas_workspace_config_are_read_from_the_environment() -> None:
    from workbench.estimate import CUBLAS_WORKSPACE_DEFAULT, cublas_workspace_bytes, expandable_segments_configured

    assert expandable_segments_configured({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"})
    assert not expandable_segments_configured({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert cublas_workspace_bytes("NVIDIA H100 80GB HBM3", {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) == 32 * MIB
    assert cublas_workspace_bytes("NVIDIA H100 80GB HBM3", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == 128 * 1024
    assert cublas_workspace_bytes("NVIDIA A100-SXM4-80GB", {}) == CUBLAS_WORKSPACE_DEFAULT == 8 * MIB + 128 * 1024
    assert cublas_workspace_bytes("NVIDIA B200", {}) == CUBLAS_WORKSPACE_HOPPER


class ElevenMiBWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(11 * MIB // 4))  # 11 MiB of fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight[:1]


def test_the_estimate_counts_an_unsplit_segment_and_states_its_error_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    workload = Workload.from_callables(model_fn=ElevenMiBWeight, batch_fn=lambda n, g: (torch.randn(n, 1, generator=g),),
                                       loss_fn=lambda out, batch: out.sum(), batch_size=1)  # fmt: skip
    gpu = estimate_memory(workload, TrainConfig(optimizer="sgd"), "NVIDIA H100 80GB HBM3")
    assert gpu.breakdown["parameters"] == 12 * MIB  # 11 MiB in a 12 MiB segment that is not split
    # weight, its gradient and SGD's momentum are each > 1 MiB: 3 MiB of reuse slack, plus the workspaces.
    assert gpu.error_bound_bytes >= 3 * MIB + gpu.workspace_bytes
    assert any("error bound" in note for note in gpu.notes)
    assert estimate_memory(workload, TrainConfig(optimizer="sgd"), "cpu").error_bound_bytes == 0


def scalar_workload() -> Workload:
    """Linear(1, 1): every tensor is a few bytes, so on CUDA each one is a whole 512-byte block."""
    return Workload.from_callables(model_fn=lambda: nn.Linear(1, 1),
                                   batch_fn=lambda n, g: (torch.randn(n, 1, generator=g),),
                                   loss_fn=lambda out, batch: out.sum(), batch_size=1)  # fmt: skip


def test_the_rounding_model_applies_per_tensor_on_cuda_only() -> None:
    cpu = estimate_memory(scalar_workload(), TrainConfig(), "cpu")
    gpu = estimate_memory(scalar_workload(), TrainConfig(), "H100")
    # weight (4 B) and bias (4 B): 8 bytes on the host, two 512-byte blocks on the GPU.
    assert cpu.breakdown["parameters"] == 8 and gpu.breakdown["parameters"] == 2 * 512
    assert all(value % 512 == 0 for value in gpu.breakdown.values())
    assert not all(value % 512 == 0 for value in cpu.breakdown.values())
    assert gpu.workspace_bytes == cuda_workspace_bytes("H100") and gpu.tensor_peak_bytes is None
    assert gpu.peak_bytes - gpu.workspace_bytes > cpu.peak_bytes


def test_fake_tensors_size_batches_that_would_not_fit_here() -> None:
    small = estimate_memory("e2e-planner", TrainConfig(), "L4", batch_size=16)
    huge = estimate_memory("e2e-planner", TrainConfig(), "L4", batch_size=16 * 1024)
    assert huge.peak_bytes > 30 * 2**30  # more than this machine's memory, estimated without allocating it
    activations = huge.breakdown["activations"] / small.breakdown["activations"]
    assert activations == pytest.approx(1024, rel=0.02)
    assert huge.fits is False and small.fits is True


def test_max_batch_size_is_the_last_size_whose_estimate_fits() -> None:
    budget = 300 * 2**20
    search = max_batch_size("e2e-planner", TrainConfig(), "H100", budget)
    size = search.max_batch_size
    assert size > 4 and search.estimate is not None and search.estimate.peak_bytes <= budget
    assert search.probes[size] <= budget and search.probes[size + 1] > budget
    assert len(search.probes) <= 8  # the linear prediction saves most probes
    assert max_batch_size(scalar_workload(), TrainConfig(), "H100", memory_budget=1000).max_batch_size == 0


def test_compile_and_cuda_graphs_are_estimated_as_eager_with_a_note() -> None:
    config = TrainConfig(compile="default", cuda_graphs=True, matmul_precision="high", optimizer_impl="fused")
    estimate = estimate_memory(scalar_workload(), config, "H100")
    text = " ".join(estimate.notes)
    assert "compile" in text and "CUDA graphs" in text and "fused" in text


def test_cli_estimate_and_max_batch_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--workload", "e2e-planner", "--device-name", "A100 80GB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device_name"] == "A100 80GB" and data["batch_size"] == 16 and data["fits"] is True
    # A user's own workload by spec (this module is importable under pytest): Linear(1, 1) needs 14 blocks.
    args = ["estimate", "--workload", "test_estimate:scalar_workload", "--device-name", "cpu", "--max-batch-size"]
    assert main([*args, "--memory-budget", "10GB"]) == 0
    assert "largest batch that fits 9.3 GiB is 65536" in capsys.readouterr().out  # the search's limit
    assert main(["estimate", "--memory-budget", "lots", "--max-batch-size"]) == 2
    assert "not a size" in capsys.readouterr().err
    assert main(["estimate", "--device-name", "TPU v9", "--max-batch-size"]) == 2
    assert "not in the peak table" in capsys.readouterr().err
