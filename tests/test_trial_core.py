"""One trial core: a trial's device is resolved and its config checked once, whatever the path, and
its request crosses to another process in one wire form that comes back equal."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from call_count import counting_environment, counts, install

from workbench.config import ConfigError, TrainConfig
from workbench.measure.outcome import status_of
from workbench.measure.profile import ProfileOptions
from workbench.measure.request import TrialRequest
from workbench.protocol import Protocol, run_protocol
from workbench.trials import run_trial

TINY = {"warmup": 1, "steps": 2, "device": "cpu", "preset": "tiny", "track_memory": False}


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Count in this process and in every child started during the test."""
    log = tmp_path / "calls.log"
    for name, value in counting_environment(tmp_path, log).items():
        monkeypatch.setenv(name, value)
    import workbench.device as device
    import workbench.levers as levers

    for name, module in (("check_config", levers), ("resolve_device", device)):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    install(str(log))
    return log


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_trial_resolves_its_device_and_checks_its_config_once(call_log: Path, isolation: str) -> None:
    result = run_trial("bev-perception", TrainConfig(), isolation=isolation, **TINY)
    assert result.status == "ok", result.message
    assert counts(call_log) == {"check_config": 1, "resolve_device": 1}, call_log.read_text()


def test_a_paired_comparison_checks_each_configuration_once(call_log: Path) -> None:
    protocol = Protocol(design="paired", paired_workers=1, budget_s=1.0, min_rounds=1, max_rounds=1, confidence=0.5)
    outcome = run_protocol("bev-perception", TrainConfig(), [TrainConfig(lr=1e-4)], protocol, store=None, **TINY)
    assert outcome.comparison.design == "paired" and outcome.comparison.rounds >= 1
    assert counts(call_log) == {"check_config": 2, "resolve_device": 2}, call_log.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a device without CUDA graphs")
def test_a_candidate_the_device_cannot_run_is_refused_before_the_baseline_runs(call_log: Path) -> None:
    with pytest.raises(ConfigError, match="candidate 1: cuda_graphs=True is not available on cpu"):
        run_protocol("bev-perception", TrainConfig(), [TrainConfig(cuda_graphs=True)], store=None, **TINY)
    assert counts(call_log)["check_config"] == 2  # baseline then candidate; no trial ran between


def test_the_wire_form_is_json_and_comes_back_equal() -> None:
    config = TrainConfig(lr=1e-4, extra={"depth": 1})
    profile = ProfileOptions.coerce(True)
    request = TrialRequest("bev-perception", config, warmup=2, steps=5, device="cpu", timeout_s=30.0,
                           memory_limit_bytes=2**30, profile=profile)  # fmt: skip
    for original in (request, request.resolved()):
        wire = json.loads(json.dumps(original.to_wire()))
        assert TrialRequest.from_wire(wire) == original
    assert TrialRequest.from_wire(request.resolved().to_wire()).checked


def test_a_workload_object_travels_pickled_and_rebuilds() -> None:
    from workbench.workloads import load_workload

    workload = load_workload("bev-perception", preset="tiny")
    plain = TrialRequest(dataclasses.replace(workload, source=None))  # no source: it must travel by value
    assert "pickled" in plain.to_wire()["workload"]
    back = TrialRequest.from_wire(json.loads(json.dumps(plain.to_wire())))
    assert back.workload.name == workload.name
    assert back.workload.effective_batch_size(TrainConfig()) == workload.effective_batch_size(TrainConfig())


def test_resolving_settles_the_device_and_refuses_what_it_cannot_run() -> None:
    import torch

    resolved = TrialRequest("bev-perception").resolved()
    expected = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolved.checked and resolved.torch_device() == expected
    assert resolved.with_config(TrainConfig(lr=1e-4)).checked is False
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda_graphs=True"):
            TrialRequest("bev-perception", TrainConfig(cuda_graphs=True), device="cpu").resolved()


def test_statuses_of_failures_are_torchs_out_of_memory_or_an_error() -> None:
    import torch

    assert status_of(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert status_of(MemoryError())[0] == "oom"
    assert status_of(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB"))[0] == "oom"
    status, message = status_of(ValueError("shape mismatch"))
    assert status == "error" and message.startswith("ValueError: shape mismatch")
