"""The step timeline (Gantt summary of the profiled window) and the Timeline tab's plain data and figures."""

from __future__ import annotations

import html
import itertools
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.analysis.trace_diff import diff_tables, diff_trials
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.measure.profile import ProfileOptions
from workbench.trials import run_trial
from workbench.workloads import Workload

STEPS = 20


def mlp_workload(hidden: int) -> Workload:
    return Workload.from_callables(
        model_fn=lambda: nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 1)),
        batch_fn=lambda n, g: (torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=16,
        name="timeline-mlp",
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialResult, TrialResult]:
    """A 20-step profiled window each: the baseline MLP, and a candidate with a ReLU recomputed by checkpointing."""
    folder = tmp_path_factory.mktemp("traces")
    options = ProfileOptions(wait=0, warmup=1, active=STEPS, trace_dir=str(folder), scan_syncs=False)
    out = []
    for config in (TrainConfig(), TrainConfig(amp="bf16")):
        result = run_trial(mlp_workload(64), config, warmup=1, steps=3, isolation="inline", profile=options,
                           track_memory=False)  # fmt: skip
        assert result.status == "ok", result.message
        out.append(result)
    return out[0], out[1]


def test_step_timeline_keeps_every_step_with_its_phases_and_bounded_op_bars(
    pair: tuple[TrialResult, TrialResult],
) -> None:
    timeline = pair[0].profile["step_timeline"]  # type: ignore[index]
    steps = timeline["steps"]
    assert [s["step"] for s in steps] == list(range(STEPS)) and steps[0]["start_ms"] == 0.0
    assert all(a["end_ms"] <= b["start_ms"] + 1e-6 for a, b in itertools.pairwise(steps))
    assert timeline["lanes"] == ["phases", "ops"]
    for index, step in enumerate(steps):
        phases = [b for b in timeline["bars"] if b["lane"] == "phases" and b["step"] == index]
        assert [b["name"] for b in sorted(phases, key=lambda b: b["start_ms"])] == [
            "data", "forward", "backward", "optimizer"]  # fmt: skip
        assert all(step["start_ms"] <= b["start_ms"] <= b["end_ms"] <= step["end_ms"] for b in phases)
        ops = [b for b in timeline["bars"] if b["lane"] == "ops" and b["step"] == index]
        assert 0 < len(ops) <= 12 and all(b["name"].startswith("aten::") for b in ops)
    # Downsampled: the AdamW for-loop alone runs far more top-level ops than the 12 a step keeps.
    assert timeline["dropped_bars"] > 0 and len(timeline["bars"]) <= STEPS * (4 + 12)


def test_timeline_view_draws_both_memory_timelines_the_gantt_and_the_diff(
    pair: tuple[TrialResult, TrialResult],
) -> None:
    pytest.importorskip("jupyter_bokeh")
    from workbench.measure.memory_timeline import CATEGORIES
    from workbench.ui.timeline_view import TimelineView

    baseline, candidate = pair
    view = TimelineView()
    view.show(baseline, candidate)
    for side, trial in (("baseline", baseline), ("candidate", candidate)):
        memory = view.memory[side].data
        expected = trial.profile["memory_timeline"]  # type: ignore[index]
        assert len(memory["t_ms"]) == len(expected["t_ms"]) > 10
        total_mib = [sum(memory[c][i] for c in CATEGORIES) for i in range(len(memory["t_ms"]))]
        assert max(total_mib) == pytest.approx(expected["peak"]["total_bytes"] / 2**20)
        assert view.phases[side].data["phase"] == ["data", "forward", "backward", "optimizer"]
        assert view.peaks[side].data["text"][0].startswith("peak ")
    gantt = view.gantt.data
    bars = candidate.profile["step_timeline"]["bars"]  # type: ignore[index]
    assert len(gantt["left"]) == len(bars) and set(gantt["lane"]) == {"phases", "ops"}
    assert view.diff is not None and view.diff.rows and "What changed" in view.diff_table.value
    # The bf16 candidate's matmuls changed dtype: the join says so. Whether they make the listed top rows depends
    # on whether bf16 is faster or slower on this CPU (listed rows push in the direction of the measured change).
    joined = diff_tables(baseline.profile["op_table"], candidate.profile["op_table"])  # type: ignore[index]
    assert any("bfloat16" in row.change for row in joined if row.name in ("aten::addmm", "aten::mm"))
    assert [r.name for r in view.diff.rows] == [r.name for r in diff_trials(baseline, candidate, top=12).rows]
    assert all(html.escape(row.change) in view.diff_table.value for row in view.diff.rows if row.change)
    assert Path(candidate.profile["trace_path"]).exists()  # type: ignore[index]
    assert "full trace" in view.header.value


def test_timeline_view_without_profiles_says_so() -> None:
    pytest.importorskip("jupyter_bokeh")
    from workbench.ui.timeline_view import TimelineView

    view = TimelineView()
    plain = TrialResult(trial_id="t1", status="ok", workload="w", config={}, step_ms=[1.0])
    view.show(plain, plain)
    assert view.memory["baseline"].data["t_ms"] == [] and "no profiled window" in view.diff_table.value


def test_the_app_shows_the_latest_profiled_trial_against_the_baselines(pair: tuple[TrialResult, TrialResult]) -> None:
    pytest.importorskip("jupyter_bokeh")
    from workbench.ui import Workbench

    baseline, candidate = pair
    app = Workbench(device="cpu")
    try:
        tabs = app.widget.children[-1]
        assert app.timeline.widget in tabs.children and "Timeline" in tabs.titles
        app.use_stored_baseline(baseline)  # the baseline alone: drawn on the left, nothing to diff
        assert len(app.timeline.memory["baseline"].data["t_ms"]) > 10
        assert app.timeline.memory["candidate"].data["t_ms"] == [] and app.timeline.diff is None
        app._show_timeline(candidate)  # a profiled candidate finished
        assert len(app.timeline.memory["candidate"].data["t_ms"]) > 10 and app.timeline.diff is not None
        assert app.timeline.diff.baseline == baseline.trial_id and app.timeline.diff.candidate == candidate.trial_id
    finally:
        app.close()
