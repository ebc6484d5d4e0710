"""A watched job whose model the user compiled gets its graph-break and recompile counts stored.

A real small training loop under `wb.watch`: `torch.compile` of a model with one explicit graph break,
fed a batch whose size changes on the third step. The truths: `torch._dynamo.explain` on the same
model (graphs and breaks), the break's line found with `inspect`, and the size change itself (a
recompile whose guard names the changed dim). backend='eager' keeps it seconds: dynamo's capture,
breaks and guards are inductor's; only code generation is skipped.
"""

from __future__ import annotations

import html
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

import workbench as wb
from workbench.cli import main as cli_main
from workbench.store import Store
from workbench.store.watched import watched_runs
from workbench.ui.watch_view import _row as watch_row


class Breaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()  # the break under test
        return self.b(h)


def _train(path: Path, name: str, model: nn.Module, sizes: list[int]) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with wb.watch(model, opt, name=name, store=path, flush_s=0.05, warmup=1) as w:
        for size in sizes:
            loss = model(torch.randn(size, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss=loss)


def _stored(path: Path, name: str) -> dict:
    with Store(path) as store:
        (run,) = watched_runs(store, name=name)
    return run.summary


def test_a_compiled_model_with_a_break_and_a_shape_change_has_its_counts_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(Breaks())(torch.randn(4, 8))
    torch._dynamo.reset()
    path = tmp_path / "h.sqlite"
    _train(path, "compiled", torch.compile(Breaks(), backend="eager"), [4, 4, 6, 6, 6])
    compiled = _stored(path, "compiled")["compile"]
    assert compiled is not None, "a compiled job must have a compile entry"
    assert compiled["graph_breaks"] == explained.graph_break_count == 1
    assert compiled["graphs"] == explained.graph_count
    lines, first = inspect.getsourcelines(Breaks)
    line = first + next(i for i, text in enumerate(lines) if "graph_break()" in text)
    assert compiled["break_sites"][0]["where"] == f"{__file__}:{line}"
    # The size changed once (4 -> 6): each compiled frame recompiles once, for dim 0 of its input.
    assert compiled["recompiles"] >= 1
    assert all(g["kind"] == "size" and "4 → 6" in g["words"] for g in compiled["recompile_guards"]), compiled
    assert cli_main(["history", "--store", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "compile: " in shown and "1 graph break(s)" in shown
    with Store(path) as store:
        (run,) = watched_runs(store, name="compiled")
    assert f"first break at {__file__}:{line}" in html.unescape(watch_row(run))  # the Watch panel's row


def test_a_job_that_compiles_nothing_has_no_compile_entry(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    _train(path, "eager", Breaks(), [4, 6])
    assert _stored(path, "eager")["compile"] is None
