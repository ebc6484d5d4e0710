"""A workload whose step time is set by the OS clock on both sides of the loader: each sample sleeps
SAMPLE_MS in `__getitem__` and the forward sleeps COMPUTE_MS, so with num_workers=0 the data
pipeline's share of a step is known before anything is measured: the independent truth for the
ideal-loader bound and for the worker count that is enough."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset

import workbench as wb
from workbench.workloads import Workload

BATCH = 4
SAMPLE_MS = 6.0
COMPUTE_MS = 24.0
INJECTED_DATA_MS = BATCH * SAMPLE_MS


class SleepySamples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i after SAMPLE_MS of sleep, all of it inside the 'decode' stage marker."""

    def __init__(self, sample_ms: float = SAMPLE_MS) -> None:
        self.sample_ms = sample_ms

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with wb.stage("decode"):  # the public marker a user puts in their own Dataset
            time.sleep(self.sample_ms / 1000.0)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(8, generator=generator), torch.randn(1, generator=generator)


class SleepyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(COMPUTE_MS / 1000.0)
        return self.linear(x)


def slow_data_workload(sample_ms: float = SAMPLE_MS) -> Workload:
    return Workload.from_callables(
        model_fn=SleepyModel,
        dataset_fn=lambda: SleepySamples(sample_ms),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=BATCH,
        name="slow-data",
    )
