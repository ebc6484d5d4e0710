"""A tiny Linear -> LayerNorm -> GELU -> Linear workload: inductor fuses its norm and activation into
one generated kernel and leaves its two matmuls to the library (the compiled-step tests' model)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workbench.workloads import Workload


class NormGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.b = nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.functional.gelu(self.norm(self.a(x))) * 2 + 1)


def _batch(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(batch_size, 8, generator=generator)


def _loss(out: Any, batch: Any) -> torch.Tensor:
    return out.pow(2).mean()


def norm_gelu_workload() -> Workload:
    return Workload.from_callables(NormGelu, _loss, batch_fn=_batch, batch_size=4)


class BreakingNormGelu(NormGelu):
    """NormGelu with one explicit graph break between its two halves."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.norm(self.a(x)))
        torch._dynamo.graph_break()  # the break the compile tests look for
        return self.b(h * 2 + 1)


def _growing_batch(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """Batch i has 2 + (i mod 4) rows: the size changes on every step, so the model recompiles."""
    return torch.randn(2 + generator.initial_seed() % 4, 8, generator=generator)


def breaking_workload() -> Workload:
    return Workload.from_callables(BreakingNormGelu, _loss, batch_fn=_growing_batch, batch_size=4)
