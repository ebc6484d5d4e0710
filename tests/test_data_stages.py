"""Where a sample's time goes: stage times taken in the loader, charged to the step that used them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from slow_data_workload import BATCH, SAMPLE_MS, slow_data_workload

import workbench as wb
from workbench.config import ConfigError
from workbench.measure import TrialRequest
from workbench.measure.data_stages import COPY, NO_COPY_ON_CPU, stages_text
from workbench.workloads import WorkloadError


def _trial(workload: wb.Workload, **config: object) -> wb.TrialResult:
    result = wb.run_trial(
        workload,
        wb.TrainConfig(**config),
        steps=6,
        warmup=1,
        data_stages=True,
        track_memory=False,  # type: ignore[arg-type]
    )
    assert result.ok, result.message
    assert result.data_stages is not None
    return result


@pytest.mark.parametrize("workers", [0, 1])
def test_an_injected_decode_cost_is_charged_to_its_stage(workers: int) -> None:
    result = _trial(slow_data_workload(), num_workers=workers)
    stages = result.data_stages["stages"]  # type: ignore[index]
    decode = stages["decode"]
    assert decode["per"] == "sample" and decode["count"] == 6 * BATCH
    assert 0.8 * SAMPLE_MS <= decode["mean_ms"] <= 1.5 * SAMPLE_MS  # the sleep, measured where it ran
    assert set(stages) == {"decode", "collate"}  # nothing else was marked: no invented stage
    who = "main process" if workers == 0 else "worker 0"
    step_ms = result.median_step_ms or 0.0
    # Busy share: the worker's preparation over the window; the truth is the injected sleep per step.
    assert result.data_stages["busy_share"][who] == pytest.approx(min(1.0, BATCH * SAMPLE_MS / step_ms), abs=0.15)  # type: ignore[index]


def test_each_fetch_is_charged_to_the_step_that_used_it() -> None:
    result = _trial(slow_data_workload(sample_ms=1.0), grad_accumulation=2)
    fetches = result.data_stages["fetches"]  # type: ignore[index]
    assert [f["fetch"] for f in fetches] == list(range(2, 14))  # the warm-up step took fetches 0 and 1
    assert [f["step"] for f in fetches] == [f["fetch"] // 2 for f in fetches]
    assert all(f["prepare_ms"] >= 0.8 * BATCH * 1.0 for f in fetches)


def test_the_bytes_a_step_copies_are_counted() -> None:
    result = _trial(slow_data_workload(sample_ms=0.5), grad_accumulation=2)
    summary = result.data_stages
    assert summary is not None
    one_batch = BATCH * (8 + 1) * 4  # float32 inputs of 8 and targets of 1, known from the dataset
    assert all(f["batch_bytes"] == one_batch for f in summary["fetches"])
    assert summary["bytes_per_step"] == 2 * one_batch


def test_the_copy_is_not_measured_on_a_cpu_trial_and_says_why() -> None:
    result = _trial(slow_data_workload(sample_ms=0.5))
    summary = result.data_stages
    assert summary is not None
    assert COPY not in summary["stages"] and summary["not_measured"] == {COPY: NO_COPY_ON_CPU}
    assert all(f["copy_ms"] is None for f in summary["fetches"])
    assert f"{COPY}   not measured: {NO_COPY_ON_CPU}" in stages_text(summary)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host-to-device copy needs a CUDA device")
def test_the_copy_to_the_gpu_is_timed_on_the_device() -> None:
    result = wb.run_trial(slow_data_workload(sample_ms=0.5), steps=6, warmup=1, device="cuda", data_stages=True)
    assert result.ok and result.data_stages is not None
    copy = result.data_stages["stages"][COPY]
    assert copy["count"] == 6 and copy["mean_ms"] > 0.0


def test_the_camera_pipelines_stages_are_all_there(tmp_path: Path) -> None:
    workload = wb.load_workload("bev-perception", camera_files=True, cache_dir=str(tmp_path))
    stages = _trial(workload).data_stages["stages"]  # type: ignore[index]
    assert set(stages) == {"read", "decode", "transform", "targets", "collate"}
    assert all(s["mean_ms"] > 0 and s["p90_ms"] >= 0 for s in stages.values())


def test_stage_times_need_samples_and_a_loader() -> None:
    batch_fn = wb.Workload.from_callables(
        model_fn=lambda: torch.nn.Linear(2, 1),
        batch_fn=lambda n, g: (torch.randn(n, 2, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: torch.nn.functional.mse_loss(out, batch[1]),
    )
    with pytest.raises(WorkloadError, match="stage times need a map-style dataset of samples"):
        wb.run_trial(batch_fn, steps=2, warmup=1, data_stages=True, isolation="inline")
    with pytest.raises(ConfigError, match=r"the ideal loader .* has none"):
        TrialRequest.of("bev-perception", staged_batches=2, data_stages=True)


def test_run_data_stages_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    args = ["run", "--workload", "slow_data_workload:slow_data_workload", "--data-stages", "--steps", "4"]
    assert main([*args, "--warmup", "1", "--no-store"]) == 0
    out = capsys.readouterr().out
    assert "where a batch's time goes (measured where it was prepared):" in out
    assert "  decode " in out and "per sample (16)" in out
    assert f"not measured: {NO_COPY_ON_CPU}" in out
