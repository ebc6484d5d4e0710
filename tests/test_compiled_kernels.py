"""What the compiler made of a profiled compiled step, against truths that do not come from it.

One real inductor compile of a tiny Linear -> LayerNorm -> GELU -> Linear model (`compiled_workload`) (seconds with the
suite's shared inductor cache). The truths: the eager trial's own profiled op table (every op a
generated kernel claims to fuse is an ATen op the eager step ran), and the analytic count of matmuls
that stay library calls — two Linear layers run two `addmm` forward and three `mm` backward (grad of
the second layer's input, and of both weights; the first layer's input needs no grad).
"""

from __future__ import annotations

from typing import Any

import pytest
from compiled_workload import norm_gelu_workload

from workbench.analysis.trace_diff import diff_trials, format_diff
from workbench.config import TrainConfig
from workbench.measure.compiled_kernels import generated_kernel, kernel_ranges, split_ops
from workbench.measure.profile import ProfileOptions
from workbench.measure.result import TrialResult
from workbench.terminal import run_summary
from workbench.trials import run_trial
from workbench.ui.timeline_view import diff_html

PROFILE = ProfileOptions(scan_syncs=False, memory_timeline=False)


@pytest.fixture(scope="module")
def trials() -> dict[str, TrialResult]:
    workload = norm_gelu_workload()
    found = {}
    for name, config in (("eager", TrainConfig()), ("compiled", TrainConfig(compile="default"))):
        result = run_trial(workload, config, isolation="inline", warmup=2, steps=3, track_memory=False, profile=PROFILE)
        assert result.ok, result.message
        found[name] = result
    return found


def _compiled(trial: TrialResult) -> dict[str, Any]:
    return (trial.profile or {}).get("compiled") or {}


def test_a_profiled_compiled_trial_lists_a_cpp_fused_kernel_with_the_ops_it_fused(
    trials: dict[str, TrialResult],
) -> None:
    fused = _compiled(trials["compiled"])["fused"]
    assert fused, _compiled(trials["compiled"])
    assert all(row["kind"] == "cpp" and "cpp_fused_" in row["name"] for row in fused)
    # The forward's norm and activation are one pointwise-after-reduction chain: inductor fuses them.
    assert any({"native_layer_norm", "gelu"} <= set(row["ops"]) for row in fused), fused
    eager_ops = {row["name"] for row in trials["eager"].profile["op_table"]}  # type: ignore[index]
    for row in fused:
        assert row["ms_per_step"] > 0 and row["calls_per_step"] >= 1
        assert {f"aten::{op}" for op in row["ops"]} <= eager_ops, (row, sorted(eager_ops))
    assert [row["ms_per_step"] for row in fused] == sorted((row["ms_per_step"] for row in fused), reverse=True)


def test_the_matmuls_stay_library_calls_as_many_as_the_model_has(trials: dict[str, TrialResult]) -> None:
    extern = {row["name"]: row["calls_per_step"] for row in _compiled(trials["compiled"])["extern"]}
    assert extern.get("aten::addmm") == 2 and extern.get("aten::mm") == 3, extern


def test_a_compiled_step_launches_fewer_kernels_than_eager(trials: dict[str, TrialResult]) -> None:
    compiled, eager = trials["compiled"].profile or {}, trials["eager"].profile or {}
    assert compiled["launches_per_step"] < eager["launches_per_step"]
    # The compiled trial's own eager step (the same step with compilation stood aside) counts as the eager trial.
    own_eager = _compiled(trials["compiled"])["eager_launches_per_step"]
    assert own_eager == pytest.approx(eager["launches_per_step"], rel=0.1)
    assert _compiled(trials["eager"]) == {}  # an eager step ran no compiled graph


def test_the_op_diff_shows_the_fused_kernels_and_the_launches_side_by_side(trials: dict[str, TrialResult]) -> None:
    diff = diff_trials(trials["eager"], trials["compiled"], top=200)
    appeared = [row for row in diff.rows if row.change.startswith("appeared (fused:")]
    assert appeared and all(generated_kernel(row.name) for row in appeared)
    assert "native_layer_norm" in " ".join(row.change for row in appeared)
    assert diff.launches["baseline_launches_per_step"] > diff.launches["candidate_launches_per_step"]
    assert "launches per step" in format_diff(diff)
    shown = diff_html(diff, limit=200)  # the Timeline tab's diff table
    assert "launches per step" in shown and "appeared (fused: " in shown


def test_the_run_summary_names_the_kernels_and_what_they_fused(trials: dict[str, TrialResult]) -> None:
    text = run_summary(trials["compiled"])
    assert "launches per step (eager:" in text and "fuses " in text and "aten::addmm x2" in text


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("graph_0_cpp_fused_gelu_native_layer_norm_0", ("cpp", ["gelu", "native_layer_norm"])),
        (
            "triton_per_fused_native_layer_norm_native_layer_norm_backward_3",
            ("triton", ["native_layer_norm", "native_layer_norm_backward"]),
        ),
        ("triton_poi_fused_add_relu_12", ("triton", ["add", "relu"])),
        ("aten::mm", None),
        ("void cutlass::Kernel<...>", None),
    ],
)
def test_generated_kernel_names_are_read_as_inductor_writes_them(name: str, expected: Any) -> None:
    assert generated_kernel(name) == expected


def test_a_name_part_that_is_no_op_stays_one_word() -> None:
    assert split_ops("add_notanop_thing") == ["add", "notanop_thing"]


def test_the_profiled_steps_after_the_window_add_no_recompile_to_the_report() -> None:
    # The memory timeline's step runs with one intra-op thread (a profiler workaround), a global-state
    # guard inductor recompiles on: the report is the trial's own steps, before the workbench's extra ones.
    options = ProfileOptions(scan_syncs=False, memory_timeline=True)
    config = TrainConfig(compile="default")
    result = run_trial(
        norm_gelu_workload(), config, isolation="inline", warmup=2, steps=3, track_memory=False, profile=options
    )
    assert result.ok, result.message
    assert (result.profile or {}).get("memory_timeline", {}).get("error") is None
    assert (result.compile_report or {})["recompiles"] == []


def test_kernel_ranges_are_on_only_inside_and_a_moved_setting_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.config as inductor_config

    before = inductor_config.cpp.enable_kernel_profile
    with kernel_ranges(True):
        assert inductor_config.cpp.enable_kernel_profile is True
    assert inductor_config.cpp.enable_kernel_profile == before
    with kernel_ranges(False):
        assert inductor_config.cpp.enable_kernel_profile == before

    def moved(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("cpp.enable_kernel_profile")

    monkeypatch.setattr(type(inductor_config), "patch", moved)  # the config module refuses new attributes
    with kernel_ranges(True):  # the trial runs on; its profile's note says why no CPU kernel is listed
        assert inductor_config.cpp.enable_kernel_profile == before
