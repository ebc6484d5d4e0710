"""Per-trial utilization and energy over the timed window, against independent readings.

The truths: psutil's CPU times of this process read from the trial's own events (the last
warm-up step, the last timed step), the CPU seconds a busy loop spends by its own thread
clock, a step that only sleeps, and energy counters whose arithmetic is done by hand.
"""

from __future__ import annotations

import time
from typing import Any

import psutil
import pytest
import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.measure import StepMeasured, TrialResult
from workbench.measure.utilization import cpu_figures, energy_figures, spread
from workbench.trials import run_trial
from workbench.workloads import Workload

SPIN_CPU_S = 0.025
SLEEP_S = 0.05


class Spin(nn.Module):
    """Forward burns a fixed amount of this thread's CPU time (not wall time: a loaded host
    slows the loop down, it does not change the CPU it costs)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.thread_time() + SPIN_CPU_S
        while time.thread_time() < end:
            pass
        return self.linear(x)


class Nap(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP_S)
        return self.linear(x)


def _workload(model: type[nn.Module], name: str) -> Workload:
    return Workload.from_callables(
        model_fn=model,
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
        name=name,
    )


class EdgeReadings:
    """psutil's process CPU times and the wall clock at the last warm-up step's event and at each
    timed step's event: the window's edges as the trial itself reported them."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.process = psutil.Process()
        self.start: tuple[float, float] | None = None
        self.timed: list[tuple[float, float]] = []

    def __call__(self, event: Any) -> None:
        if not isinstance(event, StepMeasured):
            return
        times = self.process.cpu_times()
        reading = (time.time(), times.user + times.system)
        if not event.timed and event.step == self.warmup - 1:
            self.start = reading
        elif event.timed:
            self.timed.append(reading)


@pytest.fixture(scope="module")
def spin() -> tuple[TrialResult, EdgeReadings]:
    edges = EdgeReadings(warmup=1)
    result = run_trial(_workload(Spin, "spin"), TrainConfig(), steps=10, warmup=1, track_memory=False,
                       isolation="inline", on_event=edges)  # fmt: skip
    assert result.ok, result.message
    return result, edges


@pytest.fixture(scope="module")
def nap() -> TrialResult:
    result = run_trial(_workload(Nap, "nap"), TrainConfig(), steps=4, warmup=1, track_memory=False, isolation="inline")
    assert result.ok, result.message
    return result


def test_cpu_attribution_matches_psutil_over_the_window(spin: tuple[TrialResult, EdgeReadings]) -> None:
    result, edges = spin
    assert edges.start is not None and edges.timed
    psutil_cpu_s = edges.timed[-1][1] - edges.start[1]
    cpu = result.utilization["cpu"] if result.utilization else {}
    probe_cpu_s = cpu["cores_used"] * cpu["window_s"]
    assert probe_cpu_s == pytest.approx(psutil_cpu_s, rel=0.10)


def test_a_busy_loop_reads_about_one_core_a_sleeping_step_about_none(
    spin: tuple[TrialResult, EdgeReadings], nap: TrialResult
) -> None:
    busy = spin[0].utilization["cpu"] if spin[0].utilization else {}
    idle = nap.utilization["cpu"] if nap.utilization else {}
    # The loop's own thread clock: 10 steps of SPIN_CPU_S each, plus a little framework work.
    assert busy["cores_used"] * busy["window_s"] == pytest.approx(10 * SPIN_CPU_S, rel=0.25)
    # One thread cannot use more than one core; a loaded host can only take some away, and the
    # probe says who: the trial's share plus the other processes' cores fill what was busy.
    assert busy["cores_used"] <= 1.1
    assert busy["cores_used"] >= 0.85 or busy["other_cores"] >= 0.3
    assert idle["cores_used"] < 0.15
    assert busy["cores_used"] > 5 * idle["cores_used"]
    assert busy["cores_available"] == len(psutil.Process().cpu_affinity())
    assert busy["util_pct"] == pytest.approx(100 * busy["cores_used"] / busy["cores_available"])


def test_the_recorded_window_is_the_timed_steps_alone(spin: tuple[TrialResult, EdgeReadings]) -> None:
    result, edges = spin
    assert result.timed_window is not None and edges.start is not None
    start, end = result.timed_window
    assert edges.start[0] <= start <= edges.timed[0][0]  # after warm-up ended, before the first timed step ended
    assert edges.timed[-1][0] <= end <= edges.timed[-1][0] + 0.05
    assert end - start == pytest.approx(sum(result.step_ms) / 1000.0, rel=0.1)


def test_cpu_figures_from_constructed_readings() -> None:
    # (monotonic s, trial CPU s, host busy s): 2 s, the trial 1.5 CPU s, the host 3.0 busy s.
    readings = [(10.0, 1.0, 100.0), (11.0, 1.5, 101.0), (12.0, 2.5, 103.0)]
    cpu = cpu_figures(readings, cores=2, host_cores=4)
    assert cpu["cores_used"] == pytest.approx(0.75)
    assert cpu["util_pct"] == pytest.approx(37.5)
    assert cpu["host_busy_cores"] == pytest.approx(1.5)
    assert cpu["host_pct"] == pytest.approx(37.5)
    assert cpu["other_cores"] == pytest.approx(0.75)
    assert cpu["cores_used_spread"] == spread([0.5, 1.0])
    assert cpu["host_pct_spread"]["median"] == pytest.approx(37.5)


def test_energy_per_step_and_sample_from_counter_readings() -> None:
    energy = energy_figures(1_000_000.0, 1_500_000.0, steps=10, samples_per_step=8, window_s=2.0, reason="")
    assert energy["available"]
    assert energy["joules"] == pytest.approx(500.0)
    assert energy["per_step_j"] == pytest.approx(50.0)
    assert energy["per_sample_j"] == pytest.approx(6.25)
    assert energy["mean_power_w"] == pytest.approx(250.0)
    stuck = energy_figures(5.0, 5.0, steps=3, samples_per_step=8, window_s=0.01, reason="")
    assert not stuck["available"] and "did not advance" in stuck["reason"]
    assert "backwards" in energy_figures(9.0, 5.0, steps=3, samples_per_step=8, window_s=1.0, reason="")["reason"]
    assert energy_figures(None, None, 3, 8, 1.0, reason="no counter")["reason"] == "no counter"


def test_a_cpu_trial_says_why_it_has_no_energy_or_gpu_figures(nap: TrialResult) -> None:
    assert nap.energy is not None and not nap.energy["available"]
    assert "CPU" in nap.energy["reason"]
    assert nap.utilization is not None and nap.utilization["gpu"] is None
    assert "CPU" in nap.utilization["gpu_reason"]


def test_the_figures_survive_json_and_the_store(nap: TrialResult, tmp_path: Any) -> None:
    from workbench.store import Store

    again = TrialResult.from_json(nap.to_json())
    assert (again.utilization, again.energy, again.timed_window) == (nap.utilization, nap.energy, nap.timed_window)
    with Store(tmp_path / "history.sqlite") as store:
        store.recorder("run").save(nap)
        stored = store.get(nap.trial_id).result
    assert stored.utilization == nap.utilization and stored.timed_window == nap.timed_window


def test_the_run_summary_prints_the_window_utilization(nap: TrialResult) -> None:
    from workbench.terminal import run_summary

    text = run_summary(nap)
    cpu = nap.utilization["cpu"] if nap.utilization else {}
    assert f"{cpu['cores_used']:.2f} of {cpu['cores_available']} cores" in text
    assert "energy" in text and "CPU" in text


# --- against the baseline -------------------------------------------------------------


def _constructed(trial_id: str, cores: float, gpu_util: float | None, joules_per_step: float | None) -> TrialResult:
    gpu = None if gpu_util is None else {
        "nvml_index": 0, "name": "GPU", "samples": 5, "util_pct": {"median": gpu_util, "p10": 0.0, "p90": 100.0},
        "mem_util_pct": {"median": 20.0, "p10": 10.0, "p90": 30.0}, "sm_clock_mhz": None, "mem_used_bytes": None,
    }  # fmt: skip
    energy = {"available": False, "reason": "a CPU trial"}
    if joules_per_step is not None:
        energy = {"available": True, "joules": joules_per_step * 3, "per_step_j": joules_per_step,
                  "per_sample_j": joules_per_step / 4, "mean_power_w": 300.0}  # fmt: skip
    return TrialResult(
        trial_id=trial_id, status="ok", workload="toy", config=TrainConfig().to_dict(), steps=3, samples_per_step=4,
        step_ms=[10.0, 11.0, 12.0], losses=[1.0, 0.9, 0.8],
        utilization={"cpu": {"cores_used": cores, "cores_available": 2, "util_pct": 50.0 * cores, "host_pct": 90.0,
                             "other_cores": 1.8 - cores}, "gpu": gpu, "gpu_reason": ""},
        energy=energy,
    )  # fmt: skip


def test_the_comparison_carries_utilization_and_energy_deltas() -> None:
    from workbench.analysis.compare import compare_trials

    base = [_constructed("b1", 0.6, 55.0, 12.0), _constructed("b2", 0.8, 65.0, 14.0)]  # medians 0.7, 60%, 13 J
    cand = [_constructed("c1", 1.0, 90.0, 10.0), _constructed("c2", 1.2, 92.0, 11.0)]  # medians 1.1, 91%, 10.5 J
    comp = compare_trials(base, [cand])
    assert comp.baseline.utilization is not None
    assert comp.baseline.utilization["cpu_cores_used"] == pytest.approx(0.7)
    assert comp.baseline.utilization["energy_per_step_j"] == pytest.approx(13.0)
    delta = comp.candidates[0].utilization_delta
    assert delta is not None
    assert delta["gpu_util_pct"] == pytest.approx(31.0)
    assert delta["cpu_cores_used"] == pytest.approx(0.4)
    assert delta["energy_per_step_j"] == pytest.approx(-2.5)
    assert delta["energy_per_sample_j"] == pytest.approx(-2.5 / 4)
    assert delta["sm_clock_mhz"] is None  # neither side had it
    data = comp.to_dict()
    assert data["candidates"][0]["utilization_delta"]["gpu_util_pct"] == pytest.approx(31.0)


def test_the_cli_table_shows_utilization_and_energy_with_deltas() -> None:
    from workbench.analysis.compare import compare_trials
    from workbench.terminal import comparison_table

    comp = compare_trials([_constructed("b1", 0.7, None, None)], [[_constructed("c1", 1.1, None, None)]])

    class Outcome:
        comparison = comp

    text = comparison_table(Outcome())  # type: ignore[arg-type]
    assert "utilization (Δ)" in text and "energy/step (Δ)" in text
    assert "0.70 of 2 cores, host 90%" in text
    assert "1.10 of 2 cores (+0.40), host 90%" in text
    gpu = compare_trials([_constructed("b1", 0.7, 55.0, 12.0)], [[_constructed("c1", 1.1, 90.0, 10.0)]])
    Outcome.comparison = gpu
    text = comparison_table(Outcome())  # type: ignore[arg-type]
    assert "GPU 90% (+35), mem-bw 20% (+0)" in text and "10 J (-2)" in text


# --- the diagnosis reads them ---------------------------------------------------------


def _for_diagnosis(device: str, step_ms: float, data_ms: float, utilization: dict[str, Any]) -> TrialResult:
    return TrialResult(
        trial_id="d", status="ok", workload="w", config=TrainConfig().to_dict(),
        device={"type": device, "name": "NVIDIA H100 80GB HBM3" if device == "cuda" else "cpu", "cpu_cores": 2},
        step_ms=[step_ms] * 5, phase_ms={"data": [data_ms] * 5}, batch_size=8, utilization=utilization,
    )  # fmt: skip


def _gpu_util(median: float) -> dict[str, Any]:
    return {"cpu": None, "gpu": {"util_pct": {"median": median, "p10": median, "p90": median}}, "gpu_reason": ""}


def _cpu_util(used: float, other: float, threads: int = 2) -> dict[str, Any]:
    return {"cpu": {"cores_used": used, "cores_available": 2, "other_cores": other, "torch_threads": threads,
                    "host_pct": 50.0 * (used + other)}, "gpu": None, "gpu_reason": "a CPU trial"}  # fmt: skip


def test_an_under_used_gpu_with_short_steps_is_launch_or_data_bound() -> None:
    from workbench.analysis.diagnose import diagnose

    launch = diagnose(_for_diagnosis("cuda", 8.0, 0.1, _gpu_util(35.0)))
    (finding,) = [f for f in launch.findings if "NVML" in f.summary]
    assert finding.kind == "overhead" and finding.severity == "bottleneck"
    assert finding.evidence["gpu_util_pct"] == 35.0 and finding.score == pytest.approx(0.65)
    assert "kernel launches" in finding.summary and finding.recommendations
    # A third of the step waiting for data: the phases' data finding, corroborated by NVML.
    data = diagnose(_for_diagnosis("cuda", 9.0, 3.0, _gpu_util(35.0)))
    (finding,) = [f for f in data.findings if "NVML" in f.summary]
    assert finding.kind == "data" and finding.title == "Data loading bound" and "batches" in finding.summary
    for busy, step in ((95.0, 8.0), (35.0, 200.0)):  # a busy GPU, or a long step: no host-bound evidence
        assert not [f for f in diagnose(_for_diagnosis("cuda", step, 0.1, _gpu_util(busy))).findings
                    if "NVML" in f.summary]  # fmt: skip


def test_a_cpu_trial_on_few_of_its_cores_beside_busy_processes_is_contention() -> None:
    from workbench.analysis.diagnose import diagnose

    contended = diagnose(_for_diagnosis("cpu", 100.0, 1.0, _cpu_util(used=0.5, other=1.5)))
    (finding,) = [f for f in contended.findings if f.title.startswith("CPU contention")]
    assert finding.severity == "info"  # a caveat on the measurement: the step's own findings come first
    assert finding.evidence["cores_it_could_use"] == 2 and finding.evidence["unused_share"] == pytest.approx(0.75)
    assert "0.50 of the 2 core(s)" in finding.summary and "1.50 core(s) busy" in finding.summary
    assert finding.recommendations[0].rank == 1
    assert finding.recommendations[-1].changes == {"intra_op_threads": 1}  # the one core left free
    for used, other, threads in ((1.9, 0.1, 2), (0.5, 0.1, 2), (0.9, 1.0, 1)):  # busy trial, quiet host, 1 thread
        findings = diagnose(_for_diagnosis("cpu", 100.0, 1.0, _cpu_util(used, other, threads))).findings
        assert not [f for f in findings if f.title.startswith("CPU contention")]


class FailsLater(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:  # the second timed step
            raise ValueError("boom inside the timed window")
        return self.linear(x)


def test_a_window_that_fails_leaves_no_sampling_thread_behind() -> None:
    import threading

    result = run_trial(_workload(FailsLater, "fails"), TrainConfig(), steps=4, warmup=1, track_memory=False,
                       isolation="inline")  # fmt: skip
    assert result.status == "error" and "boom" in result.message
    assert result.utilization is None and result.timed_window is None
    assert not [t for t in threading.enumerate() if t.name == "workbench-window-probe"]


# --- NVML's utilization samples: only those wholly inside the window ------------------------

PERIOD_US = 166_667  # NVML's shortest sample period, 1/6 s


def _nvml_series(busy_from_s: float, until_s: float) -> list[tuple[int, float]]:
    """Samples every 1/6 s from t=0: the GPU idles until `busy_from_s`, then runs kernels throughout.

    Each value is the busy share of the period that ends at its timestamp, as NVML reports it.
    """
    series, stamp = [], 0
    while stamp <= until_s * 1e6:
        begin = stamp - PERIOD_US
        busy_us = max(0.0, stamp - max(begin, busy_from_s * 1e6))
        series.append((stamp, round(100.0 * busy_us / PERIOD_US, 3)))
        stamp += PERIOD_US
    return series


def test_only_nvml_samples_whose_period_lies_inside_the_window_count() -> None:
    from workbench.measure.utilization import samples_inside, window_utilization

    series = _nvml_series(busy_from_s=1.05, until_s=4.0)  # the window starts with the kernels at 1.05 s
    # The sample at 1.1667 s covers 1.0-1.1667 s, 0.05 s of it idle before the window: 70% busy.
    # A reading that looks back over NVML's period (nvmlDeviceGetUtilizationRates) would count it.
    assert series[7] == (1_166_669, pytest.approx(70.0, abs=0.1))
    inside = samples_inside(series, 1.05, 2.6)
    # Periods ending 1.3333 ... 2.5 s begin at or after 1.1667 s: 8 samples, every one 100% busy.
    assert inside == [100.0] * 8
    long = window_utilization(series, (1.05, 2.6))
    assert long["spread"] == {"median": 100.0, "p10": 100.0, "p90": 100.0} and not long["reason"]
    assert long["sample_period_s"] == pytest.approx(1 / 6, rel=1e-3)
    short = window_utilization(series, (1.05, 1.5))  # 0.45 s: one whole period fits
    assert short["spread"] is None and short["samples_inside"] == 1
    assert short["reason"].startswith("window too short for NVML's sampling")


def test_a_window_too_short_for_nvml_is_said_instead_of_a_host_bound_finding() -> None:
    from workbench.analysis.diagnose import diagnose

    too_short = "window too short for NVML's sampling: 1 utilization sample(s) (one every 0.17 s) fell wholly inside"
    utilization = {"cpu": None, "gpu": {"util_pct": None, "util_reason": too_short}, "gpu_reason": ""}
    diagnosis = diagnose(_for_diagnosis("cuda", 8.0, 0.1, utilization))
    assert not [f for f in diagnosis.findings if "NVML" in f.summary or "under-used" in f.title]
    assert any("window too short for NVML's sampling" in note for note in diagnosis.notes), diagnosis.notes
