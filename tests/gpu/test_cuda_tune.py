"""The tuner on a GPU: the space offers what CUDA runs, and the memory rule reads the allocator's peak.

Skipped without CUDA; `scripts/gpu-check` runs it on a GPU machine (Optuna must be importable
there for the search test; the space test needs only torch). The CPU suite (tests/test_tune.py)
covers the same logic on the CPU's tracked peak.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from workbench.config import TrainConfig
from workbench.tune import default_space, user_space

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_default_space_on_cuda_offers_graphs_pinning_and_tf32_where_the_gpu_has_them() -> None:
    space = default_space(16, "cuda")
    assert space.values["cuda_graphs"] == (False, True)
    assert space.values["pin_memory"] == (False, True)
    major, _ = torch.cuda.get_device_capability()
    assert ("high" in space.values["matmul_precision"]) == (major >= 8)


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="needs optuna")
def test_measured_peak_on_cuda_is_the_allocators_and_respects_the_limit() -> None:
    from workbench.tune import tune

    limit = 8 * 2**30
    result = tune("e2e-planner", budget_s=90, space={"batch_size": [8, 16]}, max_memory_bytes=limit, device="cuda",
                  store=None, warmup=2, steps=5, seed_from_diagnosis=False)  # fmt: skip
    measured = [t for t in result.trials if t.result is not None and t.status == "ok"]
    assert measured
    for trial in measured:
        assert trial.result is not None and "CUDA" in trial.result.memory_method
        assert 0 < (trial.peak_memory_bytes or 0) <= limit
    assert isinstance(user_space({"amp": ["fp32", "bf16"]}, "cuda").values["amp"], tuple)
    assert TrainConfig.from_dict(measured[0].config).batch_size in (8, 16)
