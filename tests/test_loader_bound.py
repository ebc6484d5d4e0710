"""The ideal-loader bound: the real loader against batches staged on the device, by the protocol."""

from __future__ import annotations

import pytest
import torch
from slow_data_workload import COMPUTE_MS, INJECTED_DATA_MS, slow_data_workload

import workbench as wb
from workbench.analysis.compare import CandidateComparison
from workbench.analysis.loader_bound import LoaderBound
from workbench.analysis.numerics import NumericsCheck
from workbench.config import ConfigError
from workbench.levers.build import build
from workbench.measure import TrialRequest
from workbench.measure.staged import batch_source

ALLOWANCE = 0.02
"""Beyond the two injected sleeps each side has small real costs of its own (collate and the loader's
fetch; backward and the optimizer; time.sleep's overshoot on both): under a point of the share here.
The truth may sit that far outside the interval."""


def test_the_bounds_data_share_is_the_injected_share() -> None:
    run = wb.compare(
        slow_data_workload(), wb.TrainConfig(), [], wb.Protocol(budget_s=40), ideal_loader=True, steps=10, store=None
    )
    bound = run.loader_bound
    assert bound is not None and bound.data_share_ci is not None and bound.ideal_step_ms is not None
    truth = INJECTED_DATA_MS / (INJECTED_DATA_MS + COMPUTE_MS)  # the two sleeps, known beforehand
    low, high = bound.data_share_ci
    assert low - ALLOWANCE <= truth <= high + ALLOWANCE, (truth, bound)
    assert bound.verdict == "faster"
    assert bound.ideal_step_ms == pytest.approx(COMPUTE_MS, rel=0.15)  # the forward's sleep is all that is left
    assert run.comparison.candidates == [] and run.comparison.winner is None  # a bound is never a winner
    assert len(run.ideal_runs) == 1 and run.ideal_runs[0].ok
    assert run.to_dict()["loader_bound"]["sentence"] == bound.sentence()


def test_a_staged_trial_steps_at_the_compute_alone() -> None:
    loader = wb.run_trial(slow_data_workload(), steps=6, warmup=1, isolation="inline", track_memory=False)
    staged = wb.run_trial(
        slow_data_workload(), steps=6, warmup=1, isolation="inline", track_memory=False, staged_batches=2
    )
    assert loader.median_step_ms is not None and staged.median_step_ms is not None
    assert loader.median_step_ms - staged.median_step_ms == pytest.approx(INJECTED_DATA_MS, rel=0.2)
    assert sorted(staged.phase_ms["data"])[3] < 1.0  # no loader behind the data phase: nothing to wait for


def test_staged_batches_are_the_loaders_own_first_batches_on_the_device_cycled() -> None:
    workload = slow_data_workload(sample_ms=0.0)
    config = wb.TrainConfig(num_workers=0)
    step = build(workload, config, torch.device("cpu"))
    real = workload.batches(config)
    expected = [next(real) for _ in range(3)]
    staged = batch_source(workload, config, step, staged=3)
    seen = [next(staged) for _ in range(6)]
    for got, want in zip(seen, expected + expected):
        torch.testing.assert_close(got[0], want[0])
    assert seen[0][0] is seen[3][0]  # the same tensors again: no copy, no loader


def test_staged_batches_is_checked_where_the_request_is_made() -> None:
    with pytest.raises(ConfigError, match="staged_batches must be an integer >= 0"):
        TrialRequest.of("bev-perception", staged_batches=-1)
    with pytest.raises(ConfigError, match=r"ideal loader.*distributed"):
        TrialRequest.of("bev-perception", wb.TrainConfig(strategy="ddp", nproc_per_node=2), staged_batches=2)


def _row(speedup: float | None, ci: tuple[float, float] | None, verdict: str = "faster") -> CandidateComparison:
    return CandidateComparison(
        summary=None,  # type: ignore[arg-type]
        speedup=speedup,
        speedup_ci=ci,
        verdict=verdict,  # type: ignore[arg-type]
        peak_memory_delta_bytes=None,
        final_loss_delta=None,
        numerics=NumericsCheck(True, None, None, None, 0.0, ""),
        break_even_steps=None,
        config_diff={},
        half_width=0.05,
    )


def test_the_sentence_carries_the_share_its_interval_and_the_best_step() -> None:
    baseline = type("Summary", (), {"median_step_ms": 100.0})()
    bound = LoaderBound.from_row(baseline, _row(1.6, (1.5, 1.75)))  # type: ignore[arg-type]
    assert bound.sentence() == "the data pipeline costs 38% of the step [33, 43]; no loader change can beat 62 ms/step"
    assert bound.within_noise(64.0) and not bound.within_noise(70.0)
    assert LoaderBound.from_dict(bound.to_dict()) == bound
    unmeasured = LoaderBound.from_row(baseline, _row(None, None, "failed"))  # type: ignore[arg-type]
    assert unmeasured.sentence() == "the ideal-loader bound was not measured (failed)"


def _cpu_result(comparison: dict[str, object] | None) -> wb.TrialResult:
    return wb.TrialResult(
        trial_id="t",
        status="ok",
        workload="w",
        config=wb.TrainConfig().to_dict(),
        device={"type": "cpu", "name": "cpu", "cpu_cores": 2},
        step_ms=[100.0] * 5,
        phase_ms={"data": [40.0] * 5},
        batch_size=4,
        comparison=comparison,
    )


def test_the_data_finding_quotes_the_measured_headroom() -> None:
    baseline = type("Summary", (), {"median_step_ms": 100.0})()
    bound = LoaderBound.from_row(baseline, _row(1.6, (1.5, 1.75)))  # type: ignore[arg-type]
    quoted = wb.diagnose(_cpu_result({"role": "baseline", "loader_bound": bound.to_dict()}))
    finding = next(f for f in quoted.findings if f.kind == "data")
    assert "the data pipeline costs 38% of the step [33, 43]; no loader change can beat 62 ms/step" in finding.summary
    assert finding.evidence["loader_bound"]["ideal_step_ms"] == pytest.approx(62.5)
    plain = next(f for f in wb.diagnose(_cpu_result(None)).findings if f.kind == "data")
    assert "staged" not in plain.summary and "loader_bound" not in plain.evidence


def test_compare_ideal_loader_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    args = ["compare", "--workload", "slow_data_workload:slow_data_workload", "--ideal-loader", "--steps", "8"]
    assert main([*args, "--warmup", "1", "--budget", "30", "--no-store"]) == 0
    out = capsys.readouterr().out
    assert "Ideal loader (batches staged on the device): the data pipeline costs " in out
    row = next(line for line in out.splitlines() if line.startswith("ideal loader"))
    assert "n/a" in row  # its numerics are not judged: it cycles other batches by design
