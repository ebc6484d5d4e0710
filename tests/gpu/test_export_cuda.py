"""CUDA tests of the exported snippet on a tiny user model: whole-step CUDA-graph capture with
bf16, and the fp16 GradScaler step. They skip themselves without a GPU (`scripts/gpu-check`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import TrainConfig
from workbench.export import to_snippet

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class TinyNet(nn.Module):
    """Conv + BatchNorm (buffers that change inside the graph) + linear head."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.GELU())
        self.head = nn.Linear(c, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


def load(config: TrainConfig, tmp_path: Path) -> dict[str, Any]:
    code = to_snippet(config, device="cuda")
    path = tmp_path / "user_snippet.py"
    path.write_text(code)
    namespace: dict[str, Any] = {"__name__": "user_snippet"}
    exec(compile(code, str(path), "exec"), namespace)
    return namespace


def micro_batches(count: int, n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """CPU batches, as a DataLoader yields them; a target the net can learn."""
    generator = torch.Generator().manual_seed(1)
    mix = torch.randn(3, 4, generator=generator)
    xs = [torch.randn(n, 3, 8, 8, generator=generator) for _ in range(count)]
    return [(x, x.mean((2, 3)) @ mix) for x in xs]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output.float(), target)


def assert_learns(losses: list[float]) -> None:
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses


@pytest.mark.parametrize(
    "changes",
    [
        {"amp": "bf16", "channels_last": True, "optimizer_impl": "fused"},
        {"amp": "bf16", "optimizer": "sgd", "grad_accumulation": 2},
    ],
    ids=["bf16-channels_last-fused-adamw", "bf16-sgd-accumulation"],
)
def test_cuda_graph_snippet_captures_replays_and_trains(changes: dict[str, Any], tmp_path: Path) -> None:
    ns = load(TrainConfig(cuda_graphs=True, lr=1e-2, **changes), tmp_path)
    model = ns["optimize_model"](TinyNet())
    optimizer = ns["make_optimizer"](model)
    if "optimizer" not in changes:
        assert optimizer.param_groups[0]["capturable"] is True
    n = ns["GRAD_ACCUMULATION"]
    data = micro_batches(4 * n)
    steps = [data[i : i + n] for i in range(0, len(data), n)]
    step = ns["make_graphed_step"](model, optimizer, steps[0], loss_fn)
    before = [p.detach().clone() for p in model.parameters()]
    losses = [float(step(steps[i % len(steps)])) for i in range(40)]
    assert_learns(losses)
    assert any(not torch.equal(p, q) for p, q in zip(before, model.parameters()))  # replays update weights
    with pytest.raises(ValueError, match="captured shape"):
        step([(x[:4], y[:4]) for x, y in steps[0]])


def test_fp16_snippet_trains_through_the_grad_scaler(tmp_path: Path) -> None:
    ns = load(TrainConfig(amp="fp16", lr=1e-2), tmp_path)
    model = ns["optimize_model"](TinyNet())
    optimizer = ns["make_optimizer"](model)
    dtypes: list[torch.dtype] = []
    model.body[0].register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    data = micro_batches(4)
    losses = [float(ns["train_step"](model, optimizer, [data[i % 4]], loss_fn)) for i in range(40)]
    assert dtypes[0] == torch.float16
    assert_learns(losses)
    scaler = ns["scaler"]
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() > 0


def test_default_snippet_runs_the_optimizer_a_default_trial_measured(tmp_path: Path) -> None:
    from workbench.levers import build
    from workbench.workloads import Workload

    workload = Workload.from_callables(TinyNet, lambda out, batch: out.sum(), batch_fn=lambda n, g: (
        torch.randn(n, 3, 8, 8, generator=g),), batch_size=2)  # fmt: skip
    measured = build(workload, TrainConfig(), "cuda")
    ran = next(a.value for a in measured.applied if a.toggle == "optimizer")
    ns = load(TrainConfig(), tmp_path)
    optimizer = ns["make_optimizer"](ns["optimize_model"](TinyNet()))
    assert ran == "adamw/foreach" and optimizer.param_groups[0]["foreach"] is True
