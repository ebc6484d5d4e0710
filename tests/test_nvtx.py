"""NVTX ranges: the step/phase order, nothing entered off CUDA, and the exported snippet's flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.export import to_snippet
from workbench.levers.build import build
from workbench.measure.nvtx import NvtxStepRanges, step_ranges
from workbench.measure.window import one_step
from workbench.workloads import Workload


class Recorder:
    """Stands in for torch.cuda.nvtx.range_push/range_pop and keeps the calls in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def push(self, name: str) -> None:
        self.calls.append(f"push {name}")

    def pop(self) -> None:
        self.calls.append("pop")


def test_ranges_nest_each_phase_inside_its_step_in_order() -> None:
    nvtx = Recorder()
    ranges = NvtxStepRanges(7, accumulation=2, graphed=False, push=nvtx.push, pop=nvtx.pop)
    ranges.begin()
    for ended in ("data", "forward", "backward", "forward", "backward", "optimizer"):
        ranges.mark(ended)
    ranges.end()
    phases = ["data", "forward", "backward", "forward", "backward", "optimizer"]
    expected = ["push workbench::step 7"]
    for phase in phases:
        expected += [f"push workbench::{phase}", "pop"]
    assert nvtx.calls == [*expected, "pop"]


def test_graphed_steps_have_one_step_phase() -> None:
    nvtx = Recorder()
    ranges = NvtxStepRanges(0, accumulation=1, graphed=True, push=nvtx.push, pop=nvtx.pop)
    ranges.begin()
    ranges.mark("data")
    ranges.mark("step")
    ranges.end()
    assert nvtx.calls == ["push workbench::step 0", "push workbench::data", "pop", "push workbench::step", "pop",
                          "pop"]  # fmt: skip


def _tiny() -> Workload:
    return Workload.from_callables(
        model_fn=lambda: nn.Linear(4, 1),
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
    )


def test_no_range_is_entered_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    nvtx = Recorder()
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", nvtx.push)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", nvtx.pop)
    workload, config = _tiny(), TrainConfig()
    train_step = build(workload, config, torch.device("cpu"))
    assert step_ranges(train_step, 0) is None
    one_step(train_step, workload.batches(config))
    assert nvtx.calls == []


def _train(code: str, path: Path, steps: int = 4) -> list[float]:
    path.write_text(code)
    ns: dict[str, Any] = {"__name__": "user_snippet"}
    exec(compile(code, str(path), "exec"), ns)
    torch.manual_seed(0)
    model = ns["optimize_model"](nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = ns["make_optimizer"](model)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        batches = [(torch.randn(4, 8, generator=gen), torch.randn(4, 1, generator=gen))
                   for _ in range(ns["GRAD_ACCUMULATION"])]  # fmt: skip
        loss = ns["train_step"](model, optimizer, batches, lambda out, b: nn.functional.mse_loss(out.float(), b[1]))
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize(
    "config",
    [TrainConfig(), TrainConfig(amp="bf16", grad_accumulation=2, attention_backend="math", pin_memory=True)],
    ids=["defaults", "bf16-accumulation-sdpa"],
)
def test_snippet_carries_the_ranges_behind_the_flag_and_trains_the_same(config: TrainConfig, tmp_path: Path) -> None:
    plain = to_snippet(config, device="cpu")
    marked = to_snippet(config, device="cpu", nvtx=True)
    assert "nvtx" not in plain
    for name in ("step", "data", "forward", "backward", "optimizer"):
        assert f'with nvtx_range("workbench::{name}"):' in marked
    # The ranges change no computation: the same seed gives the same losses (off CUDA they are no-ops).
    assert _train(marked, tmp_path / "marked.py") == _train(plain, tmp_path / "plain.py")


def test_cli_export_nvtx_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--set", "amp=bf16", "--nvtx"]) == 0
    assert 'with nvtx_range("workbench::forward"):' in capsys.readouterr().out
    assert main(["export", "--format", "json", "--nvtx"]) == 2
    assert "--nvtx marks the snippet" in capsys.readouterr().err
