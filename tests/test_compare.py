"""compare_trials: intervals that cover the truth, verdicts, numerics guard, break-even, real trials."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from workbench.analysis.compare import compare_trials, summarize
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.trials import run_trial as _run_trial
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


def _trials(
    rng: np.random.Generator, mean_ms: float, count: int, config: TrainConfig | None = None
) -> list[TrialResult]:
    """`count` simulated processes: each its own speed factor (sd 0.1), then step noise."""
    return [
        fake_result(rng.lognormal(np.log(mean_ms) + rng.normal(0, 0.1), 0.05, 20), config=config) for _ in range(count)
    ]


def test_each_trial_is_one_unit_and_too_few_are_inconclusive() -> None:
    rng = np.random.default_rng(0)
    base = _trials(rng, 100, 6)
    faster = _trials(rng, 60, 6, TrainConfig(amp="bf16"))
    slower = _trials(rng, 160, 6, TrainConfig(channels_last=True))
    comparison = compare_trials(base, [faster, slower, faster[:2]])
    verdicts = [c.verdict for c in comparison.candidates]
    assert verdicts == ["faster", "slower", "inconclusive"]  # two trials cannot show between-process noise
    row = comparison.candidates[0]
    log_medians = [np.log([r.median_step_ms or 0.0 for r in side]) for side in (base, faster)]
    assert row.speedup == pytest.approx(float(np.exp(np.mean(log_medians[0]) - np.mean(log_medians[1]))))
    assert row.speedup_ci is not None and row.speedup_ci[0] < row.speedup < row.speedup_ci[1]
    assert row.units == 6 and row.config_diff == {"amp": ("fp32", "bf16")}
    assert comparison.rounds == 6 and comparison.design == "processes" and not comparison.paired
    assert comparison.noise.baseline_drift is not None and 0.03 < comparison.noise.baseline_drift < 0.3


def test_winner_is_the_fastest_significant_one_and_ties_are_head_to_head() -> None:
    """Paired units: candidates 0 and 1 are within noise of each other, 2 is clearly slower than 0,
    and 3 is fastest but its numerics differ, so it cannot win."""
    from workbench.analysis.compare import UnitLog, compare_units
    from workbench.analysis.numerics import check_numerics

    rng = np.random.default_rng(1)
    log = UnitLog()
    factors = [1.0, 1 / 1.50, 1 / 1.49, 1 / 1.20, 1 / 2.0]
    for r in range(12):
        shared = rng.normal(0, 0.1)
        for config, factor in enumerate(factors):
            log.add(config, r, list(100 * factor * np.exp(shared + rng.normal(0, 0.01, 5))))
    summaries = [summarize([fake_result([100.0 * f])]) for f in factors]
    good = check_numerics(fake_result([1.0]), fake_result([1.0]))
    bad = dataclasses.replace(good, ok=False)
    comparison = compare_units(summaries, [good, good, good, bad], log, paired=True, design="paired", precision=0.03)
    assert [c.verdict for c in comparison.candidates] == ["faster"] * 4
    assert comparison.winner == 0 and comparison.tied == [1]


def test_comparisons_run_one_at_a_time_merge_with_the_winner_picked_across_them() -> None:
    """The app compares each candidate in its own run against one baseline; merged, the two clearly
    faster ones (intervals apart: 2x and 1.25x) rank by speed, and a slower one never wins."""
    from workbench.analysis.merge import merge_comparisons

    rng = np.random.default_rng(2)
    base = _trials(rng, 100, 6)
    runs = [compare_trials(base, [_trials(rng, mean, 6, TrainConfig(lr=lr))], confidence=0.95)
            for mean, lr in ((80, 0.1), (50, 0.2), (160, 0.3))]  # fmt: skip
    merged = merge_comparisons(base, runs)
    assert merged is not None
    assert [row.verdict for row in merged.candidates] == ["faster", "faster", "slower"]
    assert all(row is run.candidates[0] for row, run in zip(merged.candidates, runs))  # each run's own verdict
    assert merged.winner == 1 and merged.tied == []
    assert merged.baseline.median_step_ms == summarize(base).median_step_ms and merged.rounds == 6
    assert merge_comparisons([], runs) is None and merge_comparisons(base, []) is None


def test_failed_candidate_is_a_row_not_an_exception() -> None:
    comparison = compare_trials(fake_result([100, 101]), [fake_result([], status="oom", losses=[])])
    row = comparison.candidates[0]
    assert row.verdict == "failed" and row.speedup is None and row.summary.message == "boom"


def test_numerics_flags_ride_along_with_the_speedup() -> None:
    base = [fake_result([100 + i, 100], losses=[2.0, 1.8, 1.6, 1.4]) for i in range(4)]
    close = [2.0, 1.8, 1.601, 1.41]
    rows = compare_trials(base, [
        [fake_result([90 + i, 90], losses=close, config=TrainConfig(channels_last=True)) for i in range(4)],
        [fake_result([90 + i, 90], losses=[2.0, 2.5, 3.0, 3.5], config=TrainConfig(channels_last=True)) for i in range(4)],
        fake_result([90, 90], losses=[2.0, math.nan], status="diverged", config=TrainConfig(amp="fp16")),
    ]).candidates  # fmt: skip
    assert rows[0].numerics_ok is True and rows[0].verdict == "faster"
    assert rows[1].numerics_ok is False and rows[1].verdict == "faster"  # fast, and flagged as wrong
    assert rows[2].numerics_ok is False and rows[2].verdict == "failed"


def test_break_even_is_compile_cost_over_per_step_saving() -> None:
    base = [fake_result([100.0] * 5)] * 4
    compiled = [fake_result([50.0] * 5, compile_time_s=2.0, config=TrainConfig(compile="default"))] * 4
    row = compare_trials(base, [compiled]).candidates[0]
    assert row.speedup == pytest.approx(2.0)
    assert row.break_even_steps == pytest.approx(2.0 / 0.05)  # 100 ms -> 50 ms saves 0.05 s a step
    slower_compiled = [fake_result([120.0] * 5, compile_time_s=2.0, config=TrainConfig(compile="default"))] * 4
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


def test_protocol_on_real_trials_aa_is_no_difference_and_doubled_is_slower() -> None:
    """Real trials through the one protocol (paired rounds in a worker process), of steps whose
    time is set by the OS clock, so the verdicts hold on a busy machine too. grad_accumulation=2
    runs the sleeping forward twice a step: an independent truth of 0.5x."""
    from workbench.api import Protocol, run_comparison

    protocol = Protocol(precision=0.05, budget_s=90, block_steps=3)
    outcome = run_comparison(_sleep_workload(0.03), TrainConfig(), [TrainConfig(), TrainConfig(grad_accumulation=2)],
                             protocol=protocol, steps=3, warmup=1, track_memory=False, store=None)  # fmt: skip
    comparison = outcome.comparison
    assert comparison.design == "paired" and comparison.rounds >= 6
    same, doubled = comparison.candidates
    assert same.verdict == "no significant difference", (same.speedup, same.speedup_ci)
    assert same.half_width is not None and same.half_width <= 0.05 and same.numerics_ok is True
    assert doubled.verdict == "slower" and doubled.speedup_ci is not None
    assert doubled.speedup_ci[0] <= 0.5 * 1.05 and doubled.speedup_ci[1] >= 0.5 / 1.05
    assert comparison.winner is None and "within" in comparison.stop_reason
