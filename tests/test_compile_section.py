"""The Diagnosis tab's Compile section for a profiled inductor trial with a break and a shape change.

The truths: the break's line found with `inspect` in the workload's file, the recompile that a batch
changing size every step must cause, and the generated kernels' names as the profile recorded them.
"""

from __future__ import annotations

import inspect

import compiled_workload
import pytest

from workbench.config import TrainConfig
from workbench.measure.profile import ProfileOptions
from workbench.measure.result import TrialResult
from workbench.trials import run_trial
from workbench.ui.compile_section import compile_section_html
from workbench.ui.diagnosis_view import DiagnosisView


@pytest.fixture(scope="module")
def breaking() -> TrialResult:
    options = ProfileOptions(scan_syncs=False, memory_timeline=False)
    result = run_trial(
        compiled_workload.breaking_workload(),
        TrainConfig(compile="default"),
        isolation="inline",
        warmup=2,
        steps=3,
        track_memory=False,
        profile=options,
    )
    assert result.ok, result.message
    return result


def _break_line() -> str:
    lines, first = inspect.getsourcelines(compiled_workload.BreakingNormGelu)
    line = first + next(i for i, text in enumerate(lines) if "graph_break()" in text)
    return f"{compiled_workload.__file__}:{line}"


def test_the_diagnosis_tab_shows_breaks_recompiles_stages_and_kernels(breaking: TrialResult) -> None:
    view = DiagnosisView()
    view.show(breaking, workload=compiled_workload.breaking_workload())
    section = view.compile.value
    assert "<b>Compile</b>" in section and "1 graph break(s)" in section
    assert _break_line() in section
    assert "Recompiles" in section and "changed" in section  # a size guard in words: "dim 0 of ... changed 2 → 3"
    assert "compile time by stage: dynamo" in section
    fused = (breaking.profile or {})["compiled"]["fused"]
    assert fused and all(k["name"] in section for k in fused[:8])
    assert view.compile in view.widget.children


def test_an_uncompiled_trial_has_no_compile_section() -> None:
    result = run_trial(
        compiled_workload.norm_gelu_workload(), TrainConfig(), isolation="inline", warmup=1, steps=2, track_memory=False
    )
    assert compile_section_html(result) == ""


def test_the_app_judges_a_compiled_runs_compile_against_its_eager_baseline(breaking: TrialResult) -> None:
    pytest.importorskip("jupyter_bokeh")
    from workbench.ui import Workbench

    eager = run_trial(
        compiled_workload.breaking_workload(), TrainConfig(), isolation="inline", warmup=1, steps=2, track_memory=False
    )
    app = Workbench(device="cpu")
    try:
        assert app._eager_baseline(breaking) is None  # no baseline yet: nothing to judge against
        app.use_stored_baseline(eager)
        assert app._eager_baseline(breaking) is eager and app._eager_baseline(eager) is None
        view = DiagnosisView()
        view.show(breaking, workload=compiled_workload.breaking_workload())
        assert any("compile payback: not judged" in note for note in view.diagnosis.notes)  # type: ignore[union-attr]
        judged = DiagnosisView()
        judged.show(breaking, workload=compiled_workload.breaking_workload(), baseline=eager)
        assert not any("compile payback" in note for note in judged.diagnosis.notes)  # type: ignore[union-attr]
    finally:
        app.close()
