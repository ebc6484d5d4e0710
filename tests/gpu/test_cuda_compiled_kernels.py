"""What inductor made of a profiled compiled step on a GPU: Triton kernels with the ops each fused,
the matmuls left to cuBLAS, and fewer kernel launches than the same step run eagerly.

Skipped without CUDA; `scripts/gpu-check` runs it. The CPU twin is tests/test_compiled_kernels.py
(the same model: its LayerNorm and GELU fuse into one generated kernel on either device).
"""

from __future__ import annotations

import pytest
import torch
from compiled_workload import norm_gelu_workload

from workbench.config import TrainConfig
from workbench.measure.profile import ProfileOptions
from workbench.trials import run_trial

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_profiled_compiled_cuda_trial_lists_triton_kernels_with_what_they_fused() -> None:
    options = ProfileOptions(scan_syncs=False, memory_timeline=False)
    result = run_trial(
        norm_gelu_workload(),
        TrainConfig(compile="default"),
        warmup=2,
        steps=3,
        device="cuda",
        isolation="inline",
        track_memory=False,
        profile=options,
    )
    assert result.ok, result.message
    compiled = (result.profile or {})["compiled"]
    assert compiled["fused"] and all(k["kind"] == "triton" for k in compiled["fused"]), compiled
    assert any({"native_layer_norm", "gelu"} <= set(k["ops"]) for k in compiled["fused"]), compiled["fused"]
    assert {"aten::addmm", "aten::mm"} <= {k["name"] for k in compiled["extern"]}, compiled["extern"]
    assert result.profile["launches_per_step"] < compiled["eager_launches_per_step"]  # type: ignore[index]
