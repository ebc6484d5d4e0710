"""The compile report of a compiled trial, against truths that do not come from it.

Each model's break sits at a line this file finds with `inspect`; the counts are checked against
`torch._dynamo.explain` on the same model and input; the recompiling batch changes its size on
every step by construction. The trials compile with backend='eager' (dynamo's graph capture,
breaks and guards are the same as inductor's; only code generation is skipped), inline, so the
whole file stays in seconds on a 2-core CPU.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
import torch
from torch import nn

from workbench.analysis.diagnose import diagnose
from workbench.config import TrainConfig
from workbench.measure.compile_words import break_words, guard_words
from workbench.measure.result import TrialResult
from workbench.trials import run_trial
from workbench.workloads import Workload

EAGER = TrainConfig(compile="default", compile_backend="eager")


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class ExplicitBreak(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()  # the break under test
        return self.b(h)


class ItemBranch(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.mean().item() > 0:  # the break under test: a branch on a tensor's value
            h = h * 2
        return self.b(torch.relu(h))


class PrintInHelper(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        _report_shape(h)
        return self.b(h)


def _report_shape(h: torch.Tensor) -> None:
    print("hidden", tuple(h.shape))  # the break under test: inside a helper, one frame down


def _line_of(cls: type, marker: str) -> int:
    """The line in this file that holds `marker` inside `cls` (an independent truth for file:line)."""
    lines, first = inspect.getsourcelines(cls)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _batch(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(batch_size, 8, generator=generator)


def _growing_batch(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """Batch i has 2 + (i mod 4) rows: the size changes on every step."""
    return torch.randn(2 + generator.initial_seed() % 4, 8, generator=generator)


def _loss(out: Any, batch: Any) -> torch.Tensor:
    return out.pow(2).mean()


def _trial(model: type[nn.Module], config: TrainConfig = EAGER, batch_fn: Any = _batch) -> TrialResult:
    workload = Workload.from_callables(model, _loss, batch_fn=batch_fn, batch_size=4)
    return run_trial(workload, config, isolation="inline", warmup=2, steps=3, track_memory=False)


@pytest.fixture(scope="module")
def results() -> dict[str, TrialResult]:
    """One compiled trial per model (each trial starts from a reset dynamo, as a fresh worker)."""
    found = {}
    for model in (Clean, ExplicitBreak, ItemBranch, PrintInHelper):
        result = _trial(model)
        assert result.ok, result.message
        found[model.__name__] = result
    return found


@pytest.fixture(scope="module")
def reports(results: dict[str, TrialResult]) -> dict[str, dict[str, Any]]:
    return {name: result.compile_report or {} for name, result in results.items()}


def test_one_explicit_break_is_counted_at_its_line_in_this_file(reports: dict[str, dict[str, Any]]) -> None:
    report = reports["ExplicitBreak"]
    assert report["available"] and len(report["breaks"]) == 1
    brk = report["breaks"][0]
    assert brk["where"] == f"{__file__}:{_line_of(ExplicitBreak, 'the break under test')}"
    assert brk["reason_class"] == "explicit" and brk["function"] == "forward"
    assert "graph_break" in brk["code"]
    assert report["graphs"] == 2  # the graph before the break and the one after


def test_a_clean_model_has_no_break_and_one_graph(reports: dict[str, dict[str, Any]]) -> None:
    report = reports["Clean"]
    assert report["breaks"] == [] and report["graphs"] == 1 and report["recompiles"] == []
    assert report["stages_s"]["total"] > 0 and report["stages_s"]["dynamo"] > 0


def test_an_item_branch_is_a_data_dependent_break_at_its_line(reports: dict[str, dict[str, Any]]) -> None:
    breaks = reports["ItemBranch"]["breaks"]
    assert [b["reason_class"] for b in breaks] == ["data-dependent"]
    assert breaks[0]["where"].endswith(f"test_compile_report.py:{_line_of(ItemBranch, 'the break under test')}")
    assert ".item()" in breaks[0]["reason"]


def test_a_print_in_a_helper_is_placed_at_the_print_not_at_the_call(reports: dict[str, dict[str, Any]]) -> None:
    (brk,) = reports["PrintInHelper"]["breaks"]
    assert brk["reason_class"] == "print/logging" and brk["function"] == "_report_shape"
    assert brk["where"] == f"{__file__}:{_line_of(_report_shape, 'the break under test')}"


@pytest.mark.parametrize("model", [Clean, ExplicitBreak, ItemBranch, PrintInHelper])
def test_break_counts_equal_torch_dynamo_explain(model: type[nn.Module], reports: dict[str, dict[str, Any]]) -> None:
    torch.manual_seed(0)
    explained = torch._dynamo.explain(model())(torch.randn(4, 8))
    report = reports[model.__name__]
    assert len(report["breaks"]) == len(explained.break_reasons)
    lines = {f"{r.user_stack[-1].filename}:{r.user_stack[-1].lineno}" for r in explained.break_reasons}
    assert {b["where"] for b in report["breaks"]} == lines
    if model is not ItemBranch:  # its graph after the branch is empty or not by the sign of the batch's mean
        assert report["graphs"] == explained.graph_count


def test_a_batch_that_changes_size_every_step_recompiles_and_the_advice_stops_it() -> None:
    result = _trial(Clean, batch_fn=_growing_batch)
    assert result.ok, result.message
    recompiles = (result.compile_report or {})["recompiles"]
    assert len(recompiles) >= 1
    first = recompiles[0]
    assert first["kind"] == "size" and first["words"].startswith("dim 0 of `")
    assert "changed 2 → 3" in first["words"]  # batch 0 has 2 rows, batch 1 has 3
    assert "mark_dynamic" in first["fix"] and "dynamic=True" in first["fix"]

    finding = next(f for f in diagnose(result).findings if f.title == "Recompiles")
    assert finding.summary.startswith("recompiling on every new input shape") and "changed 2 → 3" in finding.summary
    fix = finding.recommendations[0]
    assert fix.changes == {"compile_dynamic": True}
    # The independent check of the advice: applied, the same batches compile once.
    fixed = _trial(Clean, fix.apply(EAGER), batch_fn=_growing_batch)
    assert fixed.ok and (fixed.compile_report or {})["recompiles"] == []


def test_the_diagnosis_names_the_break_its_line_and_the_code_change(results: dict[str, TrialResult]) -> None:
    line = _line_of(ItemBranch, "the break under test")
    finding = next(f for f in diagnose(results["ItemBranch"]).findings if f.title == "Graph breaks")
    assert finding.kind == "compile" and finding.severity == "bottleneck"
    assert f"the first at test_compile_report.py:{line}" in finding.summary and "data-dependent" in finding.summary
    advice = finding.recommendations[0]
    assert not advice.actionable and advice.title == f"Remove the graph break at test_compile_report.py:{line}"
    assert "torch.where" in advice.why
    assert not [f for f in diagnose(results["Clean"]).findings if f.kind == "compile"]


def test_fullgraph_names_the_break_and_its_line_instead_of_a_traceback() -> None:
    result = _trial(ExplicitBreak, EAGER.replace(compile_fullgraph=True))
    assert result.status == "error"
    assert f"test_compile_report.py:{_line_of(ExplicitBreak, 'the break under test')}" in result.message
    assert "Traceback" not in result.message and "compile_fullgraph=False" in result.message


def test_a_held_out_hugging_face_model_gets_a_report() -> None:
    transformers = pytest.importorskip("transformers")

    def gpt2() -> nn.Module:
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
        return transformers.GPT2LMHeadModel(config)

    def tokens(batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 100, (batch_size, 16), generator=generator)
        return {"input_ids": ids, "labels": ids}

    workload = Workload.from_callables(gpt2, batch_fn=tokens, batch_size=2)
    result = run_trial(workload, EAGER, isolation="inline", warmup=2, steps=2, track_memory=False)
    assert result.ok, result.message
    report = result.compile_report or {}
    assert report["available"] and report["graphs"] >= 1
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    assert all(not b["where"].startswith(torch_dir) for b in report["breaks"])


def test_the_report_round_trips_and_old_results_still_load(reports: dict[str, dict[str, Any]]) -> None:
    result = TrialResult("t", "ok", "custom", EAGER.to_dict(), compile_report=reports["ExplicitBreak"])
    assert TrialResult.from_json(result.to_json()).compile_report == json.loads(json.dumps(reports["ExplicitBreak"]))
    old = json.loads(result.to_json())
    del old["compile_report"]  # a result stored before the report existed
    assert TrialResult.from_dict(old).compile_report is None


def test_words_for_a_failed_size_guard_and_a_value_guard() -> None:
    size = guard_words("0/0: tensor 'L['x']' size mismatch at index 1. expected 8, actual 12")
    assert (size.words, size.kind) == ("dim 1 of `x` changed 8 → 12", "size")
    hidden = guard_words("1/1: tensor 'L['h']' size mismatch at index 0. expected 2, actual 3")
    assert "`torch._dynamo.mark_dynamic(h, 0)`" in hidden.fix  # the input that changed, not a fixed name
    value = guard_words("0/1: ___stack0 == 9.0887")
    assert value.kind == "value" and "`.item()`" in value.fix
    brk = break_words("Call to `torch._dynamo.graph_break()`\n  Explanation: User-inserted graph break.\n")
    assert brk.gb_type == "Call to `torch._dynamo.graph_break()`" and brk.reason_class == "explicit"
    assert brk.explanation == "User-inserted graph break."


def test_a_torch_without_the_records_gets_a_note_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo.utils as dynamo_utils

    from workbench.measure.compile_report import CompileWatch

    torch._dynamo.reset()
    watch = CompileWatch()
    monkeypatch.delattr(dynamo_utils, "graph_break_reasons")
    torch.compile(ExplicitBreak(), backend="eager")(torch.randn(4, 8))
    report = watch.report()
    # The per-frame records alone still place the break, at the resumed frame's line.
    assert [b["where"] for b in report.breaks] == [f"{__file__}:{_line_of(ExplicitBreak, 'the break under test')}"]
    assert "not available on torch" in report.note and "graph_break_reasons" in report.note
    monkeypatch.delattr(dynamo_utils, "get_compilation_metrics")
    bare = watch.report()
    assert not bare.available and bare.breaks == [] and "get_compilation_metrics" in bare.note
    torch._dynamo.reset()


def item_branch_workload() -> Workload:
    """For the CLI tests: 'test_compile_report:item_branch_workload' (importable under pytest)."""
    return Workload.from_callables(ItemBranch, _loss, batch_fn=_batch, batch_size=4)


CLI_EAGER = ["--set", "compile=default", "--set", "compile_backend=eager", "--steps", "2", "--warmup", "2"]


def test_cli_run_prints_the_report_and_diagnose_json_carries_it(capsys: pytest.CaptureFixture[str]) -> None:
    """In a worker process, as users run it: the report is collected there and travels back."""
    from workbench.cli import main

    line = f"test_compile_report.py:{_line_of(ItemBranch, 'the break under test')}"
    assert (
        main(["run", "--workload", "test_compile_report:item_branch_workload", *CLI_EAGER, "--quiet", "--no-store"])
        == 0
    )
    out = capsys.readouterr().out
    assert "1 graph break(s)" in out and line in out and "[data-dependent]" in out

    assert main(["diagnose", "--workload", "test_compile_report:item_branch_workload", *CLI_EAGER, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["result"]["compile_report"]["breaks"][0]["where"].endswith(line)
    graph_breaks = next(f for f in data["diagnosis"]["findings"] if f["title"] == "Graph breaks")
    assert line in graph_breaks["summary"] and graph_breaks["recommendations"][0]["actionable"] is False
