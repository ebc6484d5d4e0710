"""A data-parallel workload with a known fault on one rank: a fixed sleep in its data loading, forward,
backward or optimizer step. The rank is read from torchrun's RANK when the fault fires, so the same
workload runs everywhere and only that rank is slowed — the truth a straggler verdict must name."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from workbench.workloads import Workload

PHASES = ("data", "forward", "backward", "optimizer")


def _slowed(rank: int) -> bool:
    return os.environ.get("RANK") == str(rank)


class _SlowBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps (on the slowed rank): a backward that is late by itself."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, delay_s: float) -> torch.Tensor:
        ctx.delay_s = delay_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.delay_s)
        return grad, None


class FaultyNet(nn.Module):
    def __init__(self, phase: str, rank: int, delay_s: float, width: int = 256, norm: bool = False) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(64, width), nn.Linear(width, 1)
        # BatchNorm's buffers make DDP broadcast them at every forward's entry: a second synchronization
        self.norm = nn.BatchNorm1d(width) if norm else nn.Identity()
        self.forward_delay = delay_s if phase == "forward" and _slowed(rank) else 0.0
        self.backward_delay = delay_s if phase == "backward" and _slowed(rank) else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_delay:
            time.sleep(self.forward_delay)
        hidden = torch.relu(self.norm(self.first(x)))
        if self.backward_delay:
            hidden = _SlowBackward.apply(hidden, self.backward_delay)
        return self.second(hidden)


def straggler_workload(
    phase: str | None,
    rank: int = 1,
    delay_s: float = 0.03,
    width: int = 256,
    batch_size: int = 12,
    norm: bool = False,
) -> Workload:
    """`phase` None: no fault anywhere (the no-straggler truth); `width` and `batch_size` set the step's size."""
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES} or None, got {phase!r}")

    def model_fn() -> nn.Module:
        if phase == "optimizer" and _slowed(rank):
            register_optimizer_step_pre_hook(lambda *_: time.sleep(delay_s))  # every optimizer of this rank
        return FaultyNet(str(phase), rank, delay_s, width, norm)

    def batch_fn(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if phase == "data" and _slowed(rank):
            time.sleep(delay_s)
        return torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g)

    return Workload.from_callables(
        model_fn=model_fn,
        batch_fn=batch_fn,
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=batch_size,
        name=f"faulty-{phase or 'none'}",
    )
