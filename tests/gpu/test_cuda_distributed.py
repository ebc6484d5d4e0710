"""Distributed trials on GPUs: NCCL ranks, the bf16 hook, communication seen as NCCL kernels.

Skipped without CUDA devices (most tests need two: one per rank); `scripts/gpu-check` runs
them on a GPU machine. The CPU suite (tests/test_distributed.py) covers the same paths on gloo.
"""

from __future__ import annotations

import pytest
import torch

from workbench.analysis.numerics import relative_deviation
from workbench.config import ConfigError, TrainConfig
from workbench.trials import run_trial

DEVICES = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICES < 1, reason="needs a CUDA device")]
two_gpus = pytest.mark.skipif(DEVICES < 2, reason="needs 2 CUDA devices (one per rank)")

PLANNER = "e2e-planner"
GPU_LOSS_RTOL = 1e-3
"""cuBLAS picks reduction orders per shape: per-rank batches of 8 and one batch of 16 round differently."""


@two_gpus
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_nccl_ranks_match_one_gpu_with_the_same_global_batch(strategy: str) -> None:
    single = run_trial(PLANNER, TrainConfig(), warmup=2, steps=5, device="cuda", isolation="inline")
    result = run_trial(
        PLANNER, TrainConfig(strategy=strategy, nproc_per_node=2), warmup=2, steps=5, device="cuda", timeout_s=300
    )
    assert result.status == "ok", result.message
    assert result.distributed is not None and result.distributed["backend"] == "nccl"
    assert len(result.rank_step_ms) == 2 and all(len(t) == 5 for t in result.rank_step_ms)
    assert relative_deviation(single.losses, result.losses) < GPU_LOSS_RTOL
    # Communication is NCCL kernels on the GPU timeline, compute the other kernels.
    assert result.distributed["comm_ms"] > 0 and result.distributed["compute_ms"] > 0
    assert result.peak_memory_bytes and result.peak_memory_bytes > 0


@two_gpus
def test_bf16_hook_runs_on_nccl() -> None:
    config = TrainConfig(strategy="ddp", nproc_per_node=2, comm_hook="bf16", amp="bf16")
    result = run_trial(PLANNER, config, warmup=2, steps=3, device="cuda", timeout_s=300)
    assert result.status == "ok", result.message
    record = next(a for a in result.applied if a["toggle"] == "strategy")
    assert "bf16_compress_hook" in record["detail"]
    assert result.distributed is not None
    assert result.distributed["step_comm_bytes"] * 2 == pytest.approx(
        sum(p.numel() * 4 for p in _planner_params()), rel=0.01
    )


def test_a_single_rank_nccl_world_runs_and_more_ranks_than_gpus_is_refused() -> None:
    result = run_trial(
        PLANNER, TrainConfig(strategy="ddp", nproc_per_node=1), warmup=2, steps=3, device="cuda", timeout_s=300
    )
    assert result.status == "ok", result.message
    assert result.distributed is not None and result.distributed["backend"] == "nccl"
    with pytest.raises(ConfigError, match=f"{DEVICES} CUDA device"):
        run_trial(PLANNER, TrainConfig(strategy="ddp", nproc_per_node=DEVICES + 1), device="cuda")


def _planner_params() -> list[torch.nn.Parameter]:
    from workbench.workloads import load_workload

    return [p for p in load_workload(PLANNER).model_fn().parameters() if p.requires_grad]
