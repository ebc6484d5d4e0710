"""A workload whose step time is set by the OS clock: 4 ms + 0.5 ms per sample, so per sample
batch 8 (1.0 ms) beats batch 4 (1.5 ms) by 1.5x — an independent truth a search must find (other
per-step costs push it towards 2x). Shared by the tuner's tests and the Tune tab's."""

from __future__ import annotations

import time

import torch
from torch import nn

from workbench.workloads import Workload


class SleepyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.004 + 0.0005 * x.shape[0])
        return self.linear(x)


def sleepy_workload() -> Workload:
    return Workload.from_callables(
        model_fn=SleepyNet,
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
        name="sleepy",
    )
