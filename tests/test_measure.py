"""run_trial: timing truth against independent clocks, warm-up exclusion, events, statuses, memory."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.measure import StepMeasured, TrialFinished, TrialResult, TrialStarted
from workbench.trials import run_trial as _run_trial
from workbench.workloads import Workload, WorkloadError

# These tests check the trial logic itself, in-process; tests/test_isolation.py covers the worker.
run_trial = functools.partial(_run_trial, isolation="inline")


class Sleeper(nn.Module):
    """A model whose forward sleeps: its step time has a known floor (the OS clock is the truth)."""

    def __init__(self, sleep_s: float, first_sleep_s: float = 0.0, fail_at: int = -1, nan_at: int = -1) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.sleep_s, self.first_sleep_s, self.fail_at, self.nan_at = sleep_s, first_sleep_s, fail_at, nan_at
        self.calls = [0]  # a list, so dynamo does not guard on (and recompile for) the count

    @torch.compiler.disable  # a graph break on purpose: dynamo cannot trace time.sleep
    def _side_effects(self) -> float:
        self.calls[0] += 1
        n = self.calls[0]
        time.sleep(self.first_sleep_s if n == 1 and self.first_sleep_s else self.sleep_s)
        if n == self.fail_at:
            raise RuntimeError("user model exploded on purpose")
        return float("nan") if n == self.nan_at else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self._side_effects()
        return self.linear(x) * scale


def sleeper_workload(**kwargs: float) -> Workload:
    return Workload.from_callables(
        model_fn=lambda: Sleeper(**kwargs),  # type: ignore[arg-type]
        batch_fn=lambda n, gen: (torch.randn(n, 8, generator=gen), torch.randn(n, 1, generator=gen)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
        name="sleeper",
    )


def test_reported_median_equals_independent_timers() -> None:
    stamps: list[float] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepMeasured) and event.timed:
            stamps.append(time.perf_counter())

    result = run_trial(sleeper_workload(sleep_s=0.03), steps=10, warmup=2, on_event=on_event)
    assert result.status == "ok"
    # Truth 1: the OS sleep is a floor, and the tiny model adds little on top.
    assert 30.0 <= result.median_step_ms < 45.0
    # Truth 2: an external clock at each step's completion (intervals include the harness's own overhead).
    intervals_ms = np.diff(stamps) * 1000
    assert abs(np.median(intervals_ms) - result.median_step_ms) < 3.0
    assert len(result.step_ms) == 10 and len(result.warmup_step_ms) == 2


def test_warmup_and_compile_time_never_enter_the_statistics() -> None:
    result = run_trial(sleeper_workload(sleep_s=0.01, first_sleep_s=0.5), steps=8, warmup=2)
    assert result.time_to_first_step_s is not None and result.time_to_first_step_s >= 0.5
    assert max(result.step_ms) < 100.0
    assert result.compile_time_s == 0.0  # nothing was compiled: a slow first step is not called compile time

    compiled = TrainConfig(compile="default", compile_backend="eager")
    result = run_trial(sleeper_workload(sleep_s=0.01, first_sleep_s=0.5), compiled, steps=8, warmup=2)
    assert result.status == "ok", result.message
    assert result.compile_time_s >= 0.45
    assert result.median_step_ms is not None and result.median_step_ms < 100.0


def test_events_arrive_in_order_with_every_step() -> None:
    events: list[object] = []
    result = run_trial(sleeper_workload(sleep_s=0.0), steps=5, warmup=3, on_event=events.append)
    assert isinstance(events[0], TrialStarted) and isinstance(events[-1], TrialFinished)
    steps = [e for e in events if isinstance(e, StepMeasured)]
    assert [e.step for e in steps] == list(range(8))
    assert [e.timed for e in steps] == [False] * 3 + [True] * 5
    assert [e.loss for e in steps] == result.losses
    assert events[-1].result is result  # type: ignore[attr-defined]


def test_result_round_trips_through_json() -> None:
    result = run_trial(sleeper_workload(sleep_s=0.0), steps=4, warmup=1)
    data = result.to_dict()
    for key in ("status", "config", "median_step_ms", "step_ms", "peak_memory_bytes", "losses", "compile_time_s",
                "throughput", "environment", "applied"):  # fmt: skip
        assert key in data
    again = TrialResult.from_json(result.to_json())
    assert again == result
    assert again.median_step_ms == result.median_step_ms


def test_throughput_and_phases_follow_from_step_times() -> None:
    result = run_trial(sleeper_workload(sleep_s=0.02), TrainConfig(grad_accumulation=2), steps=6, warmup=1)
    assert result.samples_per_step == 8
    assert result.throughput == pytest.approx(8 / (result.median_step_ms / 1000))  # type: ignore[operator]
    assert set(result.phase_ms) == {"data", "forward", "backward", "optimizer"}
    for i, total in enumerate(result.step_ms):
        parts = sum(values[i] for values in result.phase_ms.values())
        assert 0.9 * total <= parts <= total
    # Two micro-batches, each sleeping 20 ms in forward.
    assert np.median(result.phase_ms["forward"]) >= 40.0


def test_user_exception_becomes_an_error_result_and_the_caller_continues() -> None:
    result = run_trial(sleeper_workload(sleep_s=0.0, fail_at=4), steps=5, warmup=1)
    assert result.status == "error"
    assert "user model exploded on purpose" in result.message
    assert "Traceback" in result.message
    assert run_trial(sleeper_workload(sleep_s=0.0), steps=2, warmup=1).status == "ok"


def test_nan_loss_is_reported_as_diverged_with_the_step() -> None:
    result = run_trial(sleeper_workload(sleep_s=0.0, nan_at=5), steps=6, warmup=2)
    assert result.status == "diverged"
    assert result.diverged_step == 4  # the fifth forward call is global step 4
    assert "step 4" in result.message


def test_cancel_from_another_thread_stops_within_a_second() -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    begin = time.perf_counter()
    result = run_trial(sleeper_workload(sleep_s=0.05), steps=1000, warmup=1, cancel=cancel)
    assert result.status == "cancelled"
    assert time.perf_counter() - begin < 1.5


def test_bad_window_and_workload_fail_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="warmup must be an integer >= 1"):
        run_trial(sleeper_workload(sleep_s=0.0), warmup=0)
    with pytest.raises(ConfigError, match="steps must be an integer >= 1"):
        run_trial(sleeper_workload(sleep_s=0.0), steps=0)
    with pytest.raises(WorkloadError, match=r"unknown workload 'bev'.*bev-perception"):
        run_trial("bev")
    with pytest.raises(WorkloadError, match="unknown preset"):
        run_trial("bev-perception", preset="huge")
    with pytest.raises(ConfigError, match=r"unknown trial option\(s\) step;.*steps"):
        run_trial(sleeper_workload(sleep_s=0.0), step=5)  # a typo is named, never silently ignored
    with pytest.raises(ConfigError, match="need isolation='process'"):
        run_trial(sleeper_workload(sleep_s=0.0), isolation="inline", timeout_s=5)


def test_measure_never_imports_the_distributed_launcher() -> None:
    """`measure` sits below `distributed` (which imports it): a trial in a worker or inline must
    not pull the torchrun side in, and the dispatcher above both (`workbench.trials`) picks."""
    code = (
        "import sys, workbench.measure.trial, workbench.measure.worker, workbench.measure.session, "
        "workbench.measure.window; print(sorted(m for m in sys.modules if m.startswith('workbench.distributed')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cpu_peak_memory_splits_into_categories_that_match_the_model() -> None:
    """Parameter and optimizer-state bytes are known analytically: the tracker must agree."""
    result = run_trial("bev-perception", TrainConfig(), steps=2, warmup=1)
    assert result.status == "ok", result.message
    workload_model = (
        __import__("workbench.workloads", fromlist=["load_workload"]).load_workload("bev-perception").model_fn()
    )
    param_bytes = sum(p.numel() * p.element_size() for p in workload_model.parameters())
    breakdown = result.memory_breakdown
    assert breakdown is not None and result.peak_memory_bytes is not None
    assert breakdown["parameters"] == param_bytes
    # AdamW keeps exp_avg and exp_avg_sq (same size as the parameters) plus a scalar step per tensor.
    assert 2 * param_bytes <= breakdown["optimizer_state"] <= 2 * param_bytes + 8 * 1024
    assert result.peak_memory_bytes >= param_bytes * 3
    assert sum(breakdown.values()) == result.peak_memory_bytes


def test_activation_checkpointing_lowers_tracked_peak_memory() -> None:
    plain = run_trial("bev-perception", TrainConfig(), steps=1, warmup=1)
    checkpointed = run_trial("bev-perception", TrainConfig(activation_checkpointing="full"), steps=1, warmup=1)
    assert plain.memory_breakdown and checkpointed.memory_breakdown
    assert checkpointed.memory_breakdown["activations"] < 0.8 * plain.memory_breakdown["activations"]
    assert checkpointed.peak_memory_bytes < plain.peak_memory_bytes  # type: ignore[operator]
