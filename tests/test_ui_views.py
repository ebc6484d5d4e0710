"""The analytical views (`wb.ui.history`, `pareto`, `op_diff`, `ranks`, `data_pipeline`): each built from
stored data of the real types, and checked against what it plots — the points, the front's members,
the flagged regression, the straggler — each figure's truth set independently by the fixture."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from test_store import COMMIT_A, COMMIT_B, COMMIT_C, fake_result
from test_stragglers import simulate
from test_trace_diff import _op, _trial

pytest.importorskip("holoviews")

import workbench as wb
from workbench.analysis.regress import Baseline, RegressionReport, check_one
from workbench.analysis.stragglers import check_stragglers
from workbench.analysis.trace_diff import diff_trials
from workbench.config import TrainConfig
from workbench.store import Store
from workbench.ui.views import ViewError, render

TUNE_FIXTURE = Path(__file__).parent / "data" / "tune_sleepy" / "tune_result.json"
BF16 = TrainConfig(amp="bf16")


def _elements(view: Any, kind: str, label: str) -> list[dict[str, Any]]:
    """The rows one labelled element of an overlay plots."""
    found = [el for el in view if type(el).__name__ == kind and el.label == label]
    assert len(found) == 1, f"one {kind} labelled {label!r}"
    return found[0].dframe().to_dict("records")


def regressed_store(tmp_path: Path) -> tuple[Store, RegressionReport, list[str]]:
    """Defaults at ~100 ms on commits A and B, then ~130 ms on C (the regression); bf16 flat at ~60 ms."""
    store = Store(tmp_path / "history.sqlite")
    start = time.time() - 1000
    rng = random.Random(0)
    current = []
    for i, (commit, level) in enumerate([(COMMIT_A, 100.0), (COMMIT_B, 101.0), (COMMIT_C, 130.0)]):
        for repeat in range(4):
            steps = [level + rng.gauss(0, 1.0) for _ in range(6)]
            result = fake_result(steps, commit=commit, started_at=start + 10 * i + repeat)
            store.save_run([result])
            if commit == COMMIT_C:
                current.append(result)
        store.save_run([fake_result([60.0, 61.0, 59.0, 60.5], commit=commit, started_at=start + 10 * i, config=BF16)])
    reference = [t.result for t in store.trials(commit=COMMIT_B, config=TrainConfig())]
    row = check_one("defaults", current, Baseline("commit B", reference), threshold=0.05)
    assert row.status == "regression"  # the fixture's truth: 30% slower, beyond a 5% gate
    report = RegressionReport("suite", "commit B", 0.05, 0.95, [row])
    return store, report, [r.trial_id for r in current]


def test_history_plots_each_configs_commits_in_order_and_marks_the_flagged_regression(tmp_path: Path) -> None:
    store, report, regressed_ids = regressed_store(tmp_path)
    view = wb.ui.history(store, "bev-perception", regressions=report)
    defaults = _elements(view, "Scatter", "defaults")
    assert [p["x"] for p in defaults] == [0, 1, 2]
    assert [p["commit"] for p in defaults] == [COMMIT_A, COMMIT_B, COMMIT_C]
    assert [round(p["median_ms"] / 10) for p in defaults] == [10, 10, 13]
    assert {p["device"] for p in defaults} == {"AMD EPYC"} and [p["trials"] for p in defaults] == [4, 4, 4]
    assert [round(p["median_ms"]) for p in _elements(view, "Scatter", "amp=bf16")] == [60, 60, 60]
    flagged = _elements(view, "Scatter", "regression")
    assert [(p["config"], p["commit"]) for p in flagged] == [("defaults", COMMIT_C)]
    by_ids = wb.ui.history(store, "bev-perception", regressions=regressed_ids[:1])
    assert [p["x"] for p in _elements(by_ids, "Scatter", "regression")] == [2]
    hovers = [tool for tool in render(view).tools if type(tool).__name__ == "HoverTool"]
    assert any(("commit", "@{commit}") in tool.tooltips and ("device", "@{device}") in tool.tooltips for tool in hovers)


def test_history_of_an_unknown_workload_says_not_measured_and_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    store, _, _ = regressed_store(tmp_path)
    empty = wb.ui.history(store, "nothing-stored")
    assert "not measured" in empty.data and "nothing-stored" in empty.data
    with pytest.raises(ViewError, match="workload must be"):
        wb.ui.history(store, "")
    with pytest.raises(ViewError, match="trial ids"):
        wb.ui.history(store, "bev-perception", regressions="abc")


def test_pareto_draws_the_tuners_front_and_marks_its_verified_winner() -> None:
    data = json.loads(TUNE_FIXTURE.read_text())
    view = wb.ui.pareto(data)
    front_numbers = {t["number"] for t in data["pareto"]}
    front = _elements(view, "Curve", "Pareto front")
    assert {p["trial"] for p in front} == front_numbers and front_numbers
    assert [p["cost_ms"] for p in front] == sorted(p["cost_ms"] for p in front)
    plotted = [p for el in view if el.label.startswith("numerics ") for p in el.dframe().to_dict("records")]
    assert {el.label for el in view if el.label.startswith("numerics ")} == {"numerics ok"}  # no empty entries
    measured = [t for t in data["trials"] if t["cost_ms"] is not None and t["peak_memory_bytes"] is not None]
    assert sorted(p["trial"] for p in plotted) == sorted(t["number"] for t in measured)
    best = data["best"]
    assert best["winner"] and best["config"]["batch_size"] == 8  # the fixture's truth: batch 8 is faster per sample
    (winner,) = _elements(view, "Scatter", "verified winner")
    (screened,) = [t for t in data["trials"] if t["config"] == best["config"]]
    assert winner["cost_ms"] == screened["cost_ms"] and winner["config"] == "batch_size: default → 8"
    assert winner["status"].startswith(f"verified winner: {best['speedup']:.2f}x [")


def test_pareto_colours_a_numerics_mismatch_apart() -> None:
    data = json.loads(TUNE_FIXTURE.read_text())
    data["trials"][3] = {**data["trials"][3], "status": "numerics"}  # its cost, as a TuneResult fills it in
    mismatched = _elements(wb.ui.pareto(data), "Scatter", "numerics mismatch")
    assert [p["trial"] for p in mismatched] == [3]
    with pytest.raises(ViewError, match="TuneResult"):
        wb.ui.pareto({"no": "trials"})


def test_op_diff_ranks_the_ops_by_their_part_of_the_change_and_shows_fused_kernels() -> None:
    eager = _trial("a", [10.0] * 5, [_op("aten::mm", 4.0, 3), _op("aten::relu", 2.0), _op("aten::add", 0.5)])
    compiled = _trial("b", [7.0] * 5, [_op("aten::mm", 4.0, 3), _op("cpp_fused_relu_add_0", 0.4)])
    compiled.profile["compiled"] = {
        "fused": [{"name": "cpp_fused_relu_add_0", "kind": "cpp", "ops": ["relu", "add"], "us": 400.0, "calls": 1}]
    }
    view = wb.ui.op_diff(eager, compiled)
    bars = next(iter(view)).dframe().to_dict("records")[::-1]  # drawn bottom-up: the largest contribution last
    assert [b["name"] for b in bars] == [r.name for r in diff_trials(eager, compiled).rows]
    assert bars[0]["name"] == "aten::relu" and bars[0]["delta_ms"] == pytest.approx(-2.0)
    assert {b["direction"] for b in bars} == {"gained (faster)", "lost (slower)"}
    fused = list(view)[1].dframe().to_dict("records")
    assert fused == [{"name": "cpp_fused_relu_add_0", "us": 400.0, "ops": "relu, add", "calls": 1}]
    with pytest.raises(ViewError, match="two profiled"):
        wb.ui.op_diff(eager)


def test_ranks_plots_each_ranks_figures_and_names_the_straggler() -> None:
    check = check_stragglers(simulate(4, 40, random.Random(1), slow=2, phase="data", delay_ms=12.0))
    assert check is not None and check.straggler == 2 and check.cause == "data"  # the simulation's truth
    view = wb.ui.ranks(check)
    rows = view.dframe().to_dict("records")
    assert {r["rank"] for r in rows} == {"rank 0", "rank 1", "rank 2 (straggler)", "rank 3"}
    data_wait = {r["rank"]: r["ms"] for r in rows if r["figure"] == "data wait"}
    assert max(data_wait, key=data_wait.__getitem__) == "rank 2 (straggler)"
    assert "straggler: rank 2 (data" in view.opts.get().kwargs["title"]
    single = wb.ui.ranks(fake_result())
    assert "not measured" in single.data
    with pytest.raises(ViewError, match="distributed TrialResult"):
        wb.ui.ranks(42)


def test_data_pipeline_plots_measured_stages_and_the_bound_and_says_not_measured_otherwise() -> None:
    summary = {
        "stages": {
            "decode": {"mean_ms": 6.1, "p90_ms": 6.4, "count": 40, "per": "sample"},
            "collate": {"mean_ms": 0.8, "p90_ms": 0.9, "count": 10, "per": "batch"},
        },
        "not_measured": {"copy to device": "a CPU trial copies no batch to a device"},
    }
    bound = {
        "loader_step_ms": 100.0,
        "ideal_step_ms": 62.0,
        "data_share": 0.38,
        "verdict": "faster",
        "sentence": "the data pipeline costs 38% of the step",
    }
    view = wb.ui.data_pipeline(summary, bound)
    stages = next(iter(view)).dframe().to_dict("records")
    assert [(s["stage"], s["mean_ms"]) for s in stages] == [("decode", 6.1), ("collate", 0.8)]
    assert "copy to device: not measured" in next(iter(view)).opts.get().kwargs["title"]
    assert list(view)[1].dframe()["ms"].tolist() == [100.0, 62.0]
    nothing = wb.ui.data_pipeline(fake_result())
    assert all("not measured" in panel.data for panel in nothing)
    with pytest.raises(ViewError, match="data-stages summary"):
        wb.ui.data_pipeline({"stages": 3})
