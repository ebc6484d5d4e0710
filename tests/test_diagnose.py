"""Diagnosis: synthetic steps with known bottlenecks are classified by their evidence; a balanced one is not.

The four trials are real (profiled, inline) and run on a shared, noisy machine, so each
bottleneck is built to be unmistakable in shares and counts — never in absolute times.
"""

from __future__ import annotations

import inspect
import json
import time
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from workbench.analysis.diagnose import Diagnosis, diagnose
from workbench.analysis.flops import FlopCount
from workbench.config import ConfigError, TrainConfig
from workbench.levers import check_config
from workbench.measure import TrialResult
from workbench.measure.profile import ProfileOptions
from workbench.peak_specs import lookup_spec
from workbench.trials import run_trial
from workbench.workloads import Workload

PROFILE = ProfileOptions(wait=0, warmup=1, active=2)


class ConvNet(nn.Module):
    """Balanced: a few wide convolutions, where the time is arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(16, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(64, 16, 3, padding=1))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class ConvNetReadingHost(ConvNet):
    """The balanced net plus one `.item()` per step, as a logging line would do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        self.last_mean = out.mean().item()  # the sync under test
        return out


class TinyOps(nn.Module):
    """Launch-bound: 80 tiny layers on a batch of 2 — each op is all overhead."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(80))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class SlowImages(Dataset[torch.Tensor]):
    """Each sample costs 15 ms of host work (a stand-in for decoding), whatever the machine's load."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        deadline = time.perf_counter() + 0.015
        while time.perf_counter() < deadline:
            pass
        return torch.randn(8, generator=torch.Generator().manual_seed(index))


def _loss(out: Any, batch: Any) -> torch.Tensor:
    return out.float().pow(2).mean()


def conv_workload(model: type[nn.Module] = ConvNet) -> Workload:
    return Workload.from_callables(model_fn=model, batch_fn=lambda n, g: (torch.randn(n, 16, 24, 24, generator=g),),
                                   loss_fn=_loss, batch_size=8, name=model.__name__)  # fmt: skip


WORKLOADS = {
    "balanced": conv_workload,
    "sync": lambda: conv_workload(ConvNetReadingHost),
    "overhead": lambda: Workload.from_callables(
        model_fn=TinyOps,
        batch_fn=lambda n, g: torch.randn(n, 8, generator=g),
        loss_fn=_loss,
        batch_size=2,
        name="tiny-ops",
    ),
    "data": lambda: Workload.from_callables(
        model_fn=lambda: nn.Linear(8, 8), dataset_fn=SlowImages, loss_fn=_loss, batch_size=4, name="slow-data"
    ),
}


@pytest.fixture(scope="module")
def trials() -> dict[str, tuple[TrialResult, Diagnosis]]:
    out = {}
    for name, make in WORKLOADS.items():
        result = run_trial(make(), TrainConfig(), warmup=1, steps=4, isolation="inline", profile=PROFILE)
        assert result.status == "ok", result.message
        out[name] = (result, diagnose(result))
    return out


def _bottlenecks(diagnosis: Diagnosis) -> list[str]:
    return [f.kind for f in diagnosis.bottlenecks]


def test_slow_dataset_is_data_bound_and_workers_are_recommended(trials: dict[str, Any]) -> None:
    result, diagnosis = trials["data"]
    # The model behind the loader is one tiny layer, so its own compute may read as overhead too;
    # what matters is which one explains the step.
    assert diagnosis.primary is not None and diagnosis.primary.kind == "data"
    assert "sync" not in diagnosis.kinds() and "compute" not in diagnosis.kinds()
    finding = diagnosis.primary
    assert finding.evidence["data_share"] > 0.5 and finding.evidence["num_workers"] == 0
    top = finding.recommendations[0]
    assert top.rank == 1 and top.changes["num_workers"] >= 1
    candidate = top.apply(TrainConfig.from_dict(result.config), device="cpu")
    assert candidate.num_workers >= 1 and candidate.persistent_workers
    # pin_memory needs a GPU: the capabilities recorded with the trial keep it out here.
    assert not any("pin_memory" in r.changes for r in finding.recommendations)


def test_many_tiny_ops_are_overhead_bound(trials: dict[str, Any]) -> None:
    _, diagnosis = trials["overhead"]
    assert _bottlenecks(diagnosis) == ["overhead"]
    evidence = diagnosis.primary.evidence
    assert evidence["framework_overhead_share"] > 0.5 and evidence["ops_per_step"] > 500
    changes = [r.changes for r in diagnosis.primary.recommendations]
    assert {"optimizer_impl": "foreach"} in changes and {"batch_size": 8} in changes
    assert not any("cuda_graphs" in c or c.get("compile") == "reduce-overhead" for c in changes)  # not on a CPU


def test_item_per_step_is_a_sync_stall_with_its_source_line(trials: dict[str, Any]) -> None:
    _, diagnosis = trials["sync"]
    assert _bottlenecks(diagnosis) == ["sync"]
    lines, first = inspect.getsourcelines(ConvNetReadingHost.forward)
    line = first + next(i for i, text in enumerate(lines) if ".item()" in text)
    finding = diagnosis.primary
    assert finding.evidence["syncs_per_step"] == 1
    assert finding.evidence["sites"][0]["source"].endswith(f"test_diagnose.py:{line} in forward")
    advice = finding.recommendations[0]
    assert not advice.actionable and f"test_diagnose.py:{line}" in advice.title
    with pytest.raises(ConfigError, match="code change"):
        advice.apply(TrainConfig())


def test_balanced_step_raises_no_false_finding(trials: dict[str, Any]) -> None:
    _, diagnosis = trials["balanced"]
    assert _bottlenecks(diagnosis) == []
    assert diagnosis.primary is not None and diagnosis.primary.kind == "compute"
    assert diagnosis.primary.severity == "info" and diagnosis.primary.evidence["conv_share"] > 0.5
    assert "MFU not available" in " ".join(diagnosis.notes)  # a CPU has no peak in the table: say so


def test_every_offered_recommendation_applies_to_a_config_valid_here(trials: dict[str, Any]) -> None:
    for result, diagnosis in trials.values():
        base = TrainConfig.from_dict(result.config)
        for finding in diagnosis.findings:
            for rec in finding.recommendations:
                if rec.actionable:
                    check_config(rec.apply(base), "cpu")
        assert Diagnosis.to_dict(diagnosis)["findings"] is not None
        assert diagnosis.to_text(result)


# --- pure functions over recorded results: the GPU reading, MFU, memory ---------------------


def _cuda_result(profile: dict[str, Any], median_ms: float = 100.0, **fields: Any) -> TrialResult:
    available = {"available": True, "reason": ""}
    return TrialResult(
        trial_id="t", status="ok", workload="w", config=TrainConfig(amp="bf16").to_dict(),
        device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "cpu_cores": 16, "total_memory_bytes": 80 * 10**9},
        capabilities={"cuda_graphs": {"true": available, "false": available},
                      "compile": {"reduce-overhead": available}},
        step_ms=[median_ms] * 5, phase_ms={"data": [1.0] * 5}, batch_size=8, profile=profile, **fields,
    )  # fmt: skip


def test_gpu_idle_between_kernels_is_launch_bound_and_cuda_graphs_come_first() -> None:
    profile = {"overhead": {"device_idle_share": 0.7, "kernels_per_step": 900, "median_kernel_us": 4.0},
               "kernel_mix": {"compute_heavy": 0.2, "conv": 0.0, "memory_bound": 0.8}, "phase_share": {}}  # fmt: skip
    diagnosis = diagnose(_cuda_result(profile))
    assert _bottlenecks(diagnosis) == ["overhead"]
    assert diagnosis.primary.recommendations[0].changes == {"cuda_graphs": True}


def test_cuda_graphs_are_not_offered_while_the_step_syncs_and_the_sync_is_named_first() -> None:
    site = {"op": "item (device→host scalar)", "source": "models/planner.py:88 in forward",
            "code": "if loss.item() > 10:", "via": "", "count": 1}  # fmt: skip
    profile = {"overhead": {"device_idle_share": 0.7, "kernels_per_step": 900, "median_kernel_us": 4.0},
               "kernel_mix": {"compute_heavy": 0.2, "conv": 0.0, "memory_bound": 0.8}, "phase_share": {},
               "syncs": {"per_step": 1.0, "sites": [site]}}  # fmt: skip
    diagnosis = diagnose(_cuda_result(profile))
    overhead = next(f for f in diagnosis.findings if f.kind == "overhead")
    first = overhead.recommendations[0]
    assert first.changes == {} and "models/planner.py:88" in first.title and "loss.item()" in first.why
    assert all(not r.changes.get("cuda_graphs") for f in diagnosis.findings for r in f.recommendations)


def test_mfu_uses_the_tables_peak_for_the_configs_dtype() -> None:
    profile = {"overhead": {"device_idle_share": 0.05}, "phase_share": {},
               "kernel_mix": {"compute_heavy": 0.9, "conv": 0.0, "memory_bound": 0.1}}  # fmt: skip
    flops = FlopCount(total=50 * 10**12)
    diagnosis = diagnose(_cuda_result(profile, median_ms=100.0), flops)
    peak = lookup_spec("H100 SXM").bf16_flops  # type: ignore[union-attr]
    assert diagnosis.mfu is not None and diagnosis.mfu.peak_flops == peak
    assert diagnosis.mfu.mfu == pytest.approx(50e12 / 0.1 / peak)
    assert diagnosis.primary.kind == "compute" and "MFU 51%" in diagnosis.primary.summary


def test_memory_near_the_device_limit_recommends_checkpointing() -> None:
    profile = {"overhead": {"device_idle_share": 0.05}, "phase_share": {}, "kernel_mix": {}}
    result = _cuda_result(profile, peak_memory_bytes=76 * 10**9, memory_breakdown={"activations": 60 * 10**9})
    finding = next(f for f in diagnose(result).findings if f.kind == "memory")
    assert finding.evidence["share"] == pytest.approx(0.95)
    assert finding.recommendations[0].changes == {"activation_checkpointing": "selective"}


def test_a_failed_trial_has_nothing_to_diagnose() -> None:
    failed = TrialResult(trial_id="x", status="error", workload="w", config=TrainConfig().to_dict())
    assert diagnose(failed).findings == [] and "nothing to diagnose" in diagnose(failed).notes[0]


# --- the Diagnosis view and the memory rows it draws ------------------------------------------


def test_memory_rows_by_category_and_by_module_depth() -> None:
    from workbench.analysis.memory_breakdown import category_rows, module_rows

    rows = category_rows({"activations": 600, "parameters": 300, "temporaries": 0, "gradients": 100})
    assert [(r.label, r.bytes) for r in rows] == [("parameters", 300), ("gradients", 100), ("activations", 600)]
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    modules = {"": {"activations": 100}, "body": {"activations": 100},
               "body.0": {"activations": 70}, "body.1": {"activations": 30}, "body.0.conv": {"activations": 70}}  # fmt: skip
    # 'body' alone says nothing; its children are the first level that splits the activations.
    assert [(r.label, r.share) for r in module_rows(modules)] == [("body.0", 0.7), ("body.1", 0.3)]


def test_diagnosis_view_shows_findings_and_apply_hands_over_a_valid_candidate(trials: dict[str, Any]) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("jupyter_bokeh")
    from workbench.ui.diagnosis_view import DiagnosisView

    received: list[TrainConfig] = []
    view = DiagnosisView(on_apply=received.append)
    result, diagnosis = trials["data"]
    view.show(result, diagnosis)
    assert "Data loading bound" in view.header.value and len(view.findings.children) == len(diagnosis.findings)
    button, rec = view.buttons[0]
    assert rec.changes["num_workers"] >= 1
    button.click()  # what a user does
    assert received and received[0].num_workers == rec.changes["num_workers"]
    check_config(received[0], "cpu")
    assert "aten::" in view.operators.value and "input shapes" in view.operators.value
    assert view.categories.data["label"] and "activations" in view.categories.data["label"]
    assert list(view._category_fig.y_range.factors) == view.categories.data["label"]

    sync_result, _ = trials["sync"]
    view.show(sync_result)  # computes the diagnosis itself when not given one
    advice = next(r for f in view.diagnosis.findings for r in f.recommendations if not r.actionable)  # type: ignore[union-attr]
    assert advice not in [r for _, r in view.buttons]  # a code change gets no Apply button
    assert view.apply(advice) is None and "code change" in view.message.value


def test_the_data_fix_runs_in_a_worker_process(trials: dict[str, Any]) -> None:
    """Loader workers inside the trial's own worker process (a daemonic process could not start them)."""
    result, diagnosis = trials["data"]
    candidate = diagnosis.primary.recommendations[0].apply(TrainConfig.from_dict(result.config), device="cpu")
    fixed = run_trial(WORKLOADS["data"](), candidate, warmup=1, steps=2)
    assert fixed.status == "ok", fixed.message
    assert fixed.config["num_workers"] == candidate.num_workers >= 1


def slow_data_workload() -> Workload:
    """For the CLI tests: 'test_diagnose:slow_data_workload' (this module is importable under pytest)."""
    return WORKLOADS["data"]()


def test_cli_diagnose_prints_findings_as_json(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    from workbench.cli import main

    code = main(["diagnose", "--workload", "test_diagnose:slow_data_workload", "--steps", "3", "--warmup", "1",
                 "--trace-dir", str(tmp_path), "--json"])  # fmt: skip
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["diagnosis"]["primary"] == "data"
    assert data["diagnosis"]["findings"][0]["recommendations"][0]["changes"]["num_workers"] >= 1
    assert data["result"]["profile"]["trace_path"].startswith(str(tmp_path))


def test_cli_run_with_profile_prints_the_diagnosis(capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    assert main(["run", "--workload", "test_diagnose:slow_data_workload", "--steps", "3", "--warmup", "1",
                 "--profile", "--quiet", "--no-store"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "Diagnosis — primary: Data loading bound" in out and "top operators" in out


def test_the_app_shows_the_mfu_the_cli_prints_for_the_same_result(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Diagnosis tab and `workbench diagnose` call the same entry point: FLOPs counted, MFU shown."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("jupyter_bokeh")
    from workbench.analysis.flops import peak_flops_for, step_flops
    from workbench.cli import main
    from workbench.ui.diagnosis_view import DiagnosisView

    measured = run_trial("bev-perception", TrainConfig(), warmup=1, steps=3, isolation="inline", track_memory=False)
    # The peak table has no CPU, so the step is read as an H100's (a recorded reading: MFU is a pure
    # function of the result, the workload's FLOPs and the table).
    gpu = "NVIDIA H100 80GB HBM3"
    result = TrialResult(**{**measured.__dict__, "device": {"type": "cuda", "name": gpu, "count": 1}})
    flops = step_flops("bev-perception", TrainConfig()).total
    peak, _ = peak_flops_for(gpu, TrainConfig())
    assert peak is not None
    expected = flops / (result.median_step_ms / 1000.0) / peak

    view = DiagnosisView()
    view.show(result)
    assert view.diagnosis is not None and view.diagnosis.mfu is not None
    assert view.diagnosis.mfu.mfu == pytest.approx(expected) and f"MFU {expected:.1%}" in view.header.value
    monkeypatch.setattr("workbench.trials.run_trial", lambda *args, **kwargs: result)
    assert main(["diagnose", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["diagnosis"]["mfu"]
    assert printed["mfu"] == pytest.approx(expected) and printed["flops_per_step"] == flops


def test_a_sync_bound_distributed_trial_is_diagnosed_with_ddp_recommendations() -> None:
    """Per-rank figures of a torchrun trial where 40% of the step is exposed communication."""
    config = TrainConfig(strategy="ddp", nproc_per_node=2, batch_size=16)
    result = TrialResult(
        trial_id="ddp", status="ok", workload="e2e-planner", config=config.to_dict(), step_ms=[100.0] * 5,
        samples_per_step=16, device={"type": "cpu", "name": "cpu"},
        distributed={"comm_share": 0.4, "hidden_share": 0.1, "exposed_comm_ms": 40.0, "comm_ms": 44.0,
                     "step_ms": 100.0, "world_size": 2, "backend": "gloo", "strategy": "ddp"},
    )  # fmt: skip
    findings = [f for f in diagnose(result).findings if f.kind == "distributed"]
    assert [f.title for f in findings] == ["distributed synchronization bound"]
    assert findings[0].score == 0.4 and "40.0 ms" in findings[0].summary
    first = findings[0].recommendations[0]
    assert first.rank == 1 and "ddp_bucket_cap_mb" in first.changes
    assert first.apply(config).ddp_bucket_cap_mb == 5.0
    balanced = TrialResult(**{**result.__dict__, "distributed": {**result.distributed, "comm_share": 0.05}})
    assert not [f for f in diagnose(balanced).findings if f.kind == "distributed"]


# --- CPU oversubscription: intra-op threads x processes against the cores --------------------


def _cpu_result(threads: int, cores: int, **config: Any) -> TrialResult:
    return TrialResult(
        trial_id="t", status="ok", workload="w", config=TrainConfig(**config).to_dict(),
        device={"type": "cpu", "name": "cpu", "cpu_cores": cores}, step_ms=[50.0] * 5,
        phase_ms={"data": [1.0] * 5}, batch_size=8,
        applied=[{"toggle": "intra_op_threads", "value": threads, "detail": ""}],
    )  # fmt: skip


def test_threads_times_processes_above_the_cores_is_oversubscription_with_a_thread_count_that_fits() -> None:
    finding = next(f for f in diagnose(_cpu_result(2, cores=2, num_workers=2)).findings if f.kind == "threads")
    assert finding.severity == "bottleneck"
    assert finding.evidence == {"intra_op_threads": 2, "processes": 1, "loader_workers": 2, "cpu_cores": 2}
    assert "4 busy threads on 2 core(s)" in finding.summary
    assert finding.recommendations[0].changes == {"intra_op_threads": 1}
    ranks = next(
        f for f in diagnose(_cpu_result(8, cores=16, strategy="ddp", nproc_per_node=4)).findings if f.kind == "threads"
    )
    assert ranks.evidence["processes"] == 4 and ranks.recommendations[0].changes == {"intra_op_threads": 4}


def test_threads_within_the_cores_and_unrecorded_threads_give_no_finding() -> None:
    assert "threads" not in diagnose(_cpu_result(2, cores=2)).kinds()
    assert "threads" not in diagnose(_cpu_result(1, cores=2, num_workers=1)).kinds()
    unrecorded = _cpu_result(4, cores=2)
    unrecorded.applied = []
    assert "threads" not in diagnose(unrecorded).kinds()


def test_every_finding_comes_from_one_registered_detector_module() -> None:
    # The registry is the one list diagnose iterates: each entry names what it reads and finds.
    from workbench.analysis.detectors.registry import DETECTORS, detector

    names = [d.name for d in DETECTORS]
    # launch-bound right after overhead: it reads (and, for a compiled trial, supersedes) that finding.
    assert names[:9] == [
        "data",
        "overhead",
        "launch-bound",
        "syncs",
        "memory",
        "threads",
        "kernels",
        "ranks",
        "utilization",
    ]
    assert names[9:] == ["graph-breaks", "recompiles", "compile-payback"]
    assert len(set(names)) == len(names) and all(d.reads for d in DETECTORS)
    assert detector("ranks") is DETECTORS[7]


def test_the_old_advice_paths_still_import_with_a_warning() -> None:
    import importlib
    import sys

    from workbench.analysis.detectors.data import for_data

    for old in ("workbench.analysis.recommend", "workbench.analysis.diagnose_utilization"):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match="is deprecated"):
            module = importlib.import_module(old)
        assert module.__name__ == old
    assert sys.modules["workbench.analysis.recommend"].for_data is for_data
