"""Memory through one step (the profiled window's extra step): peak, categories, phases, checkpointing."""

from __future__ import annotations

import functools
import itertools
import re
import sys
from typing import Any

import pytest
import torch

from workbench.config import TrainConfig
from workbench.levers.build import build
from workbench.measure.memory import track_step_memory
from workbench.measure.memory_timeline import (
    CATEGORIES,
    MemoryTimelineUnavailable,
    downsample_indices,
    memory_profiler_api,
    record_memory_timeline,
)
from workbench.measure.profile import _profiled_step
from workbench.measure.window import one_step
from workbench.workloads import load_workload


@pytest.fixture(scope="module")
def bev_pair() -> dict[str, dict[str, Any]]:
    """The tiny BEV preset without and with full activation checkpointing: one step's memory timeline each,
    and (without checkpointing) the tracked peak of another step, as the trial measures it."""
    out: dict[str, dict[str, Any]] = {}
    for policy in ("off", "full"):
        config = TrainConfig(activation_checkpointing=policy)
        workload = load_workload("bev-perception", preset="tiny")
        train_step = build(workload, config, torch.device("cpu"))
        batches = workload.batches(config)
        one_step(train_step, batches)  # optimizer state exists from here on, as after a timed window
        if policy == "off":
            step = functools.partial(one_step, train_step, batches)
            reading = track_step_memory(train_step.model, train_step.optimizer, step)
            out["tracked_peak"] = {"bytes": reading.peak_bytes}
        out[policy] = record_memory_timeline(functools.partial(_profiled_step, train_step, batches, config),
                                             train_step.device)  # fmt: skip
    return out


def _timeline(timeline: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in timeline, timeline.get("error")
    return timeline


def test_peak_matches_the_trials_tracked_peak(bev_pair: dict[str, dict[str, Any]]) -> None:
    timeline = _timeline(bev_pair["off"])
    # Independent truth: the trial's CPU peak figure, from MemTracker over a different step.
    tracked = bev_pair["tracked_peak"]["bytes"]
    assert tracked and timeline["peak"]["total_bytes"] == pytest.approx(tracked, rel=0.05)
    assert max(timeline["total_bytes"]) == timeline["peak"]["total_bytes"]  # downsampling kept the peak
    assert timeline["peak"]["phase"] in ("forward", "backward") and timeline["peak"]["op"].startswith("aten::")


def test_categories_sum_to_the_total_at_every_sample(bev_pair: dict[str, dict[str, Any]]) -> None:
    for policy in ("off", "full"):
        timeline = _timeline(bev_pair[policy])
        assert set(timeline["categories"]) == set(CATEGORIES)
        n = len(timeline["t_ms"])
        assert 50 < n <= 400 < timeline["samples"]
        for i in range(n):
            assert sum(timeline["categories"][c][i] for c in CATEGORIES) == timeline["total_bytes"][i]
        assert timeline["t_ms"] == sorted(timeline["t_ms"])
        # Parameters and optimizer state exist before the step and never drop to zero through it.
        assert min(timeline["categories"]["parameters"]) > 0 and min(timeline["categories"]["optimizer_state"]) > 0


def test_phases_are_marked_in_step_order(bev_pair: dict[str, dict[str, Any]]) -> None:
    phases = _timeline(bev_pair["off"])["phases"]
    assert [p["phase"] for p in phases] == ["data", "forward", "backward", "optimizer"]
    assert all(a["end_ms"] <= b["start_ms"] for a, b in itertools.pairwise(phases))
    assert all(p["start_ms"] < p["end_ms"] for p in phases)


def test_full_checkpointing_lowers_the_activations_peak_and_recomputes_in_backward(
    bev_pair: dict[str, dict[str, Any]],
) -> None:
    off = max(_timeline(bev_pair["off"])["categories"]["activations"])
    full = max(_timeline(bev_pair["full"])["categories"]["activations"])
    assert full < 0.8 * off
    # ... and its backward re-runs the checkpointed blocks' forward: the recompute.
    assert _timeline(bev_pair["off"])["recomputed_ops"] == {}
    assert sum(_timeline(bev_pair["full"])["recomputed_ops"].values()) > 0


def test_downsampling_keeps_the_largest_of_each_bucket_and_the_ends() -> None:
    values = [0] * 1000
    values[537] = 99
    keep = downsample_indices(values, 50)
    assert len(keep) <= 50 and 537 in keep and keep[0] == 0 and keep[-1] == 999
    assert downsample_indices([3, 1, 2], 10) == [0, 1, 2]


def test_the_private_memory_profiler_is_pinned_and_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    timeline_class, action, tensor_key = memory_profiler_api()
    assert hasattr(timeline_class, "__init__") and action.CREATE and tensor_key.__name__ == "TensorKey"
    monkeypatch.setitem(sys.modules, "torch.profiler._memory_profiler", None)
    with pytest.raises(
        MemoryTimelineUnavailable, match=re.escape(f"torch {torch.__version__} has no ") + ".*memory_timeline=False"
    ):
        memory_profiler_api()


def test_the_loader_runs_before_the_memory_profiler_starts() -> None:
    """The memory profiler records every Python call (it needs stacks): a dataset doing Python work per
    sample in the trial's process (1 s of it made stopping the profiler take two minutes) is loaded
    before it starts, so none of the loader's calls are recorded."""
    from workbench.measure.profile import _memory_timeline

    config = TrainConfig(grad_accumulation=2)
    workload = load_workload("bev-perception", preset="tiny")
    train_step = build(workload, config, torch.device("cpu"))
    source = workload.batches(config)
    fetched_while_profiling: list[bool] = []

    def batches() -> Any:
        while True:
            fetched_while_profiling.append(torch.autograd._profiler_enabled())
            yield next(source)

    timeline = _memory_timeline(train_step, batches(), config)
    assert "error" not in timeline, timeline.get("error")
    assert fetched_while_profiling == [False, False]  # both micro-batches, neither under the profiler
    assert [p["phase"] for p in timeline["phases"]][:2] == ["data", "forward"]
