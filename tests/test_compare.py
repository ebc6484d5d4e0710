"""compare_trials: intervals that cover the truth, verdicts, numerics guard, break-even, real trials."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from workbench.analysis.compare import compare_trials, speedup_interval, summarize
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.measure import run_trial as _run_trial
from workbench.workloads import Workload

# These tests check the trial logic itself, in-process; tests/test_isolation.py covers the worker.
run_trial = functools.partial(_run_trial, isolation="inline")


def fake_result(step_ms: np.ndarray | list[float], *, config: TrainConfig | None = None, losses: list[float] | None = None,
                status: str = "ok", compile_time_s: float = 0.0, peak: int | None = 1000) -> TrialResult:  # fmt: skip
    """A recorded result with chosen numbers: the statistics are checked against known distributions."""
    return TrialResult(
        trial_id=f"t{np.random.randint(1_000_000)}", status=status, workload="w",  # type: ignore[arg-type]
        config=(config or TrainConfig()).to_dict(), step_ms=[float(x) for x in step_ms],
        losses=losses if losses is not None else [2.0, 1.5, 1.2], samples_per_step=8,
        compile_time_s=compile_time_s, peak_memory_bytes=peak, message="boom" if status != "ok" else "",
    )  # fmt: skip


def test_interval_covers_the_true_ratio_at_the_stated_rate() -> None:
    """Over many simulated experiments with a known 1.25x speedup, the 90% interval covers it ~90% of the time."""
    rng = np.random.default_rng(7)
    covered = 0
    trials = 200
    for i in range(trials):
        base = rng.lognormal(np.log(100), 0.1, 40)
        cand = rng.lognormal(np.log(80), 0.1, 40)
        low, high = speedup_interval(base, cand, confidence=0.9, n_resamples=500, seed=i)
        covered += low <= 1.25 <= high
    assert 0.8 <= covered / trials <= 0.98


def test_verdicts_follow_the_interval() -> None:
    rng = np.random.default_rng(0)
    base = fake_result(rng.normal(100, 4, 30))
    faster = fake_result(rng.normal(70, 3, 30), config=TrainConfig(amp="bf16"))
    slower = fake_result(rng.normal(130, 4, 30), config=TrainConfig(channels_last=True))
    same = fake_result(rng.normal(100, 4, 30), config=TrainConfig(seed=0))
    comparison = compare_trials(base, [faster, slower, same])
    verdicts = [c.verdict for c in comparison.candidates]
    assert verdicts == ["faster", "slower", "no significant difference"]
    row = comparison.candidates[0]
    assert row.speedup == pytest.approx(np.median(base.step_ms) / np.median(faster.step_ms))
    assert row.speedup_ci is not None and row.speedup_ci[0] < row.speedup < row.speedup_ci[1]
    assert row.config_diff == {"amp": ("fp32", "bf16")}


def test_repeats_are_pooled_and_counted() -> None:
    runs = [fake_result([100, 102, 98]), fake_result([110, 108, 112])]
    summary = summarize(runs)
    assert summary.repeats == 2
    assert summary.median_step_ms == pytest.approx(np.median([100, 102, 98, 110, 108, 112]))
    comparison = compare_trials(runs, [[fake_result([50, 51, 49]), fake_result([55, 54, 56])]])
    assert comparison.repeats == 2 and comparison.candidates[0].summary.repeats == 2


def test_failed_candidate_is_a_row_not_an_exception() -> None:
    comparison = compare_trials(fake_result([100, 101]), [fake_result([], status="oom", losses=[])])
    row = comparison.candidates[0]
    assert row.verdict == "failed" and row.speedup is None and row.summary.message == "boom"


def test_numerics_flags_ride_along_with_the_speedup() -> None:
    base = fake_result([100, 100], losses=[2.0, 1.8, 1.6, 1.4])
    rows = compare_trials(base, [
        fake_result([90, 90], losses=[2.0, 1.8, 1.601, 1.41], config=TrainConfig(channels_last=True)),
        fake_result([90, 90], losses=[2.0, 2.5, 3.0, 3.5], config=TrainConfig(channels_last=True)),
        fake_result([90, 90], losses=[2.0, math.nan], status="diverged", config=TrainConfig(amp="fp16")),
    ]).candidates  # fmt: skip
    assert rows[0].numerics_ok is True and rows[0].verdict == "faster"
    assert rows[1].numerics_ok is False and rows[1].verdict == "faster"  # fast, and flagged as wrong
    assert rows[2].numerics_ok is False and rows[2].verdict == "failed"


def test_break_even_is_compile_cost_over_per_step_saving() -> None:
    base = fake_result([100.0] * 5)
    compiled = fake_result([50.0] * 5, compile_time_s=2.0, config=TrainConfig(compile="default"))
    row = compare_trials(base, [compiled]).candidates[0]
    assert row.break_even_steps == pytest.approx(2.0 / 0.05)
    slower_compiled = fake_result([120.0] * 5, compile_time_s=2.0, config=TrainConfig(compile="default"))
    assert compare_trials(base, [slower_compiled]).candidates[0].break_even_steps is None


def test_memory_delta_is_candidate_minus_baseline() -> None:
    row = compare_trials(fake_result([1, 2], peak=5000), [fake_result([1, 2], peak=3000)]).candidates[0]
    assert row.peak_memory_delta_bytes == -2000


class _SleepNet(nn.Module):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.linear, self.sleep_s = nn.Linear(4, 1), sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        __import__("time").sleep(self.sleep_s)
        return self.linear(x)


def _slow_sleep_workload() -> Workload:
    return _sleep_workload(0.08)


def _sleep_workload(sleep_s: float) -> Workload:
    return Workload.from_callables(
        model_fn=lambda: _SleepNet(sleep_s),
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
    )


def test_real_trials_identical_is_no_difference_and_slowed_is_slower() -> None:
    """Real measured trials, interleaved B C B C ... as `repeats` does, of a step whose time is
    set by the OS clock, so the verdicts hold on a busy machine too."""
    from workbench.api import run_comparison

    outcome = run_comparison(_sleep_workload(0.05), TrainConfig(), [TrainConfig(), TrainConfig(seed=0)],
                             repeats=3, steps=8, warmup=1, isolation="inline", track_memory=False)  # fmt: skip
    for row in outcome.comparison.candidates:
        assert row.verdict == "no significant difference", (row.speedup, row.speedup_ci)
        assert row.numerics_ok is True and row.numerics.early_deviation == 0.0
    slowed = run_trial(_slow_sleep_workload(), steps=8, warmup=1)
    base = outcome.baseline_runs
    assert compare_trials(base, [slowed]).candidates[0].verdict == "slower"
