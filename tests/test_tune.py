"""The auto-tuner: its space, its rules on constructed results, the search's bookkeeping, and
real (inline, tiny) searches whose right answer is known from how the workload was built."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from sleepy_workload import sleepy_workload
from torch import nn

from workbench.analysis.compare import CandidateComparison, TrialSummary
from workbench.analysis.numerics import NumericsCheck
from workbench.config import ConfigError, TrainConfig
from workbench.measure.result import TrialResult
from workbench.protocol import Protocol
from workbench.store import Store
from workbench.tune import Objective, SearchSpace, check_space, default_space, pareto_front, tune, user_space
from workbench.tune.objective import amortized_step_ms, choose_kind, cost_ms, judge, objective_row
from workbench.tune.screening import Screening

# --- the space -------------------------------------------------------------------------------


def test_default_space_offers_only_what_this_cpu_runs() -> None:
    """On a CPU: no CUDA graphs, no pinned memory, no TF32, no reduce-overhead; workers up to the cores."""
    from workbench.levers import capabilities

    space = default_space(8, "cpu", cpu_cores=2)
    assert space.values["cuda_graphs"] == (False,)
    assert space.values["pin_memory"] == (False,)
    assert space.values["matmul_precision"] == ("highest",)
    assert "reduce-overhead" not in space.values["compile"]
    assert space.values["num_workers"] == (0, 2)
    assert space.values["batch_size"] == (4, 8, 16)
    caps = capabilities("cpu")
    for name in ("optimizer_impl", "attention_backend"):
        assert set(space.values[name]) == {v for v, a in caps[name].items() if a.available}


def test_the_default_space_leaves_out_the_dtypes_this_cpu_only_emulates() -> None:
    """fp16 never on a CPU; bf16 exactly when it measures faster than fp32 here (hosts of one kind
    differ). A space file may still name either: the dtype runs, it is just not searched by default."""
    import time

    import torch

    from workbench.device import cpu_bf16_native, cpu_bf16_speedup

    amp = default_space(8, "cpu", cpu_cores=2).values["amp"]
    assert "fp16" not in amp and amp[0] == "fp32"
    native = cpu_bf16_native()
    assert ("bf16" in amp) == (native or cpu_bf16_speedup() > 1.0)
    # an independent look at the same question: a larger matmul, timed here
    a, b = torch.randn(512, 512), torch.randn(512, 512)

    def best(dtype: torch.dtype) -> float:
        x, y = a.to(dtype), b.to(dtype)
        times = []
        for _ in range(5):
            began = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - began)
        return min(times)

    faster = best(torch.float32) / best(torch.bfloat16)
    if faster > 1.3:  # a clear answer must agree with the space
        assert "bf16" in amp, faster
    if faster < 0.7 and not native:  # a CPU with bf16 instructions keeps it whatever a loaded host times
        assert "bf16" not in amp, faster
    assert user_space({"amp": ["fp32", "fp16"]}, "cpu").searched == {"amp": ("fp32", "fp16")}


def test_global_batch_keeps_batch_times_accumulation() -> None:
    space = default_space(8, "cpu", global_batch=16, cpu_cores=1)
    for size in space.values["batch_size"]:
        config = space.config(TrainConfig(), {"batch_size": size})
        assert config.batch_size * config.grad_accumulation == 16


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({}, "empty"),
        ([], "JSON object"),
        ({"amp": []}, "non-empty list"),
        ({"ampp": ["bf16"]}, "not a config field"),
        ({"lr": [0.1, 0.01]}, "does not search 'lr'"),
        ({"amp": ["fp64"]}, "not valid"),
        ({"cuda_graphs": [False, True]}, "not available here"),
        ({"batch_size": [0, 4]}, ">= 1"),
    ],
)
def test_bad_spaces_are_refused_with_the_fix(mapping: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        user_space(mapping, "cpu")


def test_contradictory_and_choiceless_spaces_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"contradictory.*prefetch_factor needs num_workers"):
        check_space(user_space({"num_workers": [0], "prefetch_factor": [2, 4]}, "cpu"), TrainConfig(), "cpu")
    with pytest.raises(ConfigError, match="no choice left"):
        check_space(user_space({"amp": ["bf16"]}, "cpu"), TrainConfig(), "cpu")


def test_validation_counts_only_valid_combinations() -> None:
    """persistent_workers needs workers: of 2x2 combinations, 3 are valid (TrainConfig's own rule)."""
    space = user_space({"num_workers": [0, 2], "persistent_workers": [False, True]}, "cpu")
    assert space.combinations == 4
    assert check_space(space, TrainConfig(), "cpu") == 3


# --- the rules, on constructed results ---------------------------------------------------------


def _result(step_ms: float, *, samples: int = 4, compile_s: float = 0.0, peak: int | None = 1000,
            status: str = "ok", losses: list[float] | None = None, **config: Any) -> TrialResult:  # fmt: skip
    return TrialResult(trial_id=f"t{step_ms}{samples}{compile_s}", status=status, workload="w",  # type: ignore[arg-type]
                       config=TrainConfig(**config).to_dict(), step_ms=[step_ms] * 5, samples_per_step=samples,
                       compile_time_s=compile_s, peak_memory_bytes=peak, losses=losses or [1.0] * 8)  # fmt: skip


def test_compile_is_amortized_over_the_planned_steps() -> None:
    """100 ms eager vs 90 ms compiled with a 60 s compile: a loss over 1,000 steps (+60 ms a step),
    a win over 100,000 (+0.6 ms)."""
    eager, compiled = _result(100.0), _result(90.0, compile_s=60.0, compile="default")
    short, long = Objective("step-time", 1000), Objective("step-time", 100_000)
    assert cost_ms(compiled, short) == pytest.approx(150.0) and cost_ms(eager, short) == pytest.approx(100.0)
    assert cost_ms(compiled, long) == pytest.approx(90.6)
    assert amortized_step_ms(90.0, 60.0, 1000) > 100.0 > amortized_step_ms(90.0, 60.0, 100_000)


def test_throughput_ranks_per_sample_and_step_time_refuses_varying_batches() -> None:
    small, big = _result(40.0, samples=4), _result(60.0, samples=8, batch_size=8)
    goal = Objective("throughput")
    assert cost_ms(big, goal) == pytest.approx(7.5) and cost_ms(small, goal) == pytest.approx(10.0)
    assert choose_kind(None, samples_vary=True) == "throughput"
    assert choose_kind(None, samples_vary=False) == "step-time"
    with pytest.raises(ConfigError, match="cannot rank different batch sizes"):
        choose_kind("step-time", samples_vary=True)


def test_memory_limit_and_numerics_guard_decide_before_speed() -> None:
    base = _result(100.0, losses=[2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3])
    goal = Objective("step-time", max_memory_bytes=5000)
    fits = judge(_result(50.0, peak=4000, losses=list(base.losses)), base, goal)
    assert fits.feasible and fits.cost_ms == pytest.approx(50.0)
    over = judge(_result(50.0, peak=6000, losses=list(base.losses)), base, goal)
    assert over.status == "over-memory" and "exceeds the limit" in over.reason
    drifted = judge(_result(50.0, peak=100, losses=[4.0, 3.9, 3.8, 3.7, 3.6, 3.5, 3.4, 3.3]), base, goal)
    assert drifted.status == "numerics"
    crashed = judge(_result(50.0, status="error"), base, goal)
    assert crashed.status == "error" and not crashed.feasible


def _row(speedup: float, ci: tuple[float, float], *, step_ms: float, compile_s: float = 0.0,
         throughput: float | None = None) -> CandidateComparison:  # fmt: skip
    summary = TrialSummary("c", TrainConfig().to_dict(), "ok", "", 1, step_ms, 1.0, throughput, 1, 0.1, compile_s, 1.0)
    return CandidateComparison(summary, speedup, ci, "faster", 0, 0.0, NumericsCheck(True, 0, 0, 0, 0.2, ""), None, {},
                               units=10, between_unit_sd=0.02)  # fmt: skip


def test_objective_row_turns_a_compile_that_never_pays_back_into_a_loss() -> None:
    """The protocol says 1.25x faster per step; a 60 s compile over 1,000 planned steps is 60 ms a
    step on a 100 ms baseline: the amortized figure is 100 / (80 + 60) ≈ 0.71 — slower."""
    base = TrialSummary("b", TrainConfig().to_dict(), "ok", "", 1, 100.0, 1.0, None, 1, 0.1, 0.0, 1.0)
    row = _row(1.25, (1.2, 1.3), step_ms=80.0, compile_s=60.0)
    short = objective_row(row, base, Objective("step-time", 1000), margin=0.02, precision=0.03)
    assert short.speedup == pytest.approx(100 / 140) and short.verdict == "slower"
    assert short.speedup_ci is not None and short.speedup_ci[1] < 1.0
    long = objective_row(row, base, Objective("step-time", 1_000_000), margin=0.02, precision=0.03)
    assert long.verdict == "faster" and long.speedup == pytest.approx(100 / 80.06, rel=1e-3)


def test_objective_row_scales_the_interval_by_samples_per_step() -> None:
    """Twice the batch at 1.6x the step time is 1.25x the throughput; the interval scales alike."""
    base = TrialSummary("b", TrainConfig().to_dict(), "ok", "", 1, 100.0, 1.0, 40.0, 1, 0.1, 0.0, 1.0)  # 4 samples
    row = _row(1 / 1.6, (1 / 1.7, 1 / 1.5), step_ms=160.0, throughput=50.0)  # 8 samples per step
    scaled = objective_row(row, base, Objective("throughput"), margin=0.02, precision=0.03)
    assert scaled.speedup == pytest.approx(1.25)
    assert scaled.speedup_ci == pytest.approx((2 / 1.7, 2 / 1.5))
    assert scaled.verdict == "faster"


def test_pareto_front_keeps_only_non_dominated_points() -> None:
    points = [(10.0, 500), (8.0, 900), (12.0, 400), (11.0, 600), (8.0, 950)]
    assert pareto_front(points) == [1, 0, 2]


# --- the search's bookkeeping, with a constructed measurement -----------------------------------


class _FakeMeasure:
    """Stands in for `run_trial` so the search's bookkeeping is tested on its own: step time
    from a formula; batch 8 crashes."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, config: TrainConfig, on_event: Any, cancel: threading.Event) -> TrialResult:
        self.calls.append(config.to_dict())
        size = config.batch_size or 4
        status = "error" if size == 8 else "ok"
        step = 10.0 + size * (0.5 if config.channels_last else 1.0)
        result = _result(step, samples=size, status=status, batch_size=config.batch_size,
                         channels_last=config.channels_last, num_workers=config.num_workers,
                         persistent_workers=config.persistent_workers)  # fmt: skip
        result.message = "RuntimeError: boom at batch 8\n\ntraceback" if status == "error" else ""
        return result


def test_screening_never_retries_a_failure_nor_runs_a_refused_combination() -> None:
    space = user_space({"batch_size": [2, 4, 8], "channels_last": [False, True],
                        "num_workers": [0, 2], "persistent_workers": [False, True]}, "cpu")  # fmt: skip
    base = _result(14.0)
    measure = _FakeMeasure()
    screening = Screening(space, TrainConfig(), base, Objective("throughput"), measure, device="cpu",
                          samples_of=lambda c: c.batch_size or 4)  # fmt: skip
    for _ in range(200):
        if screening.exhausted:
            break
        screening.step()
    keys = [json.dumps(c, sort_keys=True) for c in measure.calls]
    assert len(keys) == len(set(keys)), "a configuration was measured twice"
    assert not any(c["persistent_workers"] and c["num_workers"] == 0 for c in measure.calls), "a refused combo ran"
    assert screening.refused, "the sampler proposed refused combinations, which must be counted apart"
    failed = [t for t in screening.trials if t.status == "error"]
    assert failed and all(t.params["batch_size"] == 8 and "boom at batch 8" in t.reason for t in failed)
    assert len(screening.trials) == len(measure.calls) <= 9  # 3 x 2 x 3 valid loader settings


def test_the_estimate_decides_before_a_trial_is_spent() -> None:
    space = user_space({"batch_size": [2, 4, 8]}, "cpu")
    measure = _FakeMeasure()
    estimates = {2: 100, 4: 200, 8: 10_000}
    screening = Screening(space, TrainConfig(), _result(14.0), Objective("throughput", max_memory_bytes=5000),
                          measure, lambda c: estimates[c.batch_size or 4], device="cpu")  # fmt: skip
    for _ in range(60):
        screening.step()
    assert {c["batch_size"] for c in measure.calls} == {2, 4}
    skipped = [t for t in screening.trials if t.params["batch_size"] == 8]
    assert len(skipped) == 1 and skipped[0].status == "over-memory" and "not run" in skipped[0].reason
    assert skipped[0].estimated_peak_bytes == 10_000


# --- real searches (inline trials of a tiny model whose step time is set by the OS clock) ---------


SPACE = {"batch_size": [2, 4, 8], "optimizer_impl": ["for-loop", "foreach"]}
WINDOW = dict(steps=4, warmup=1, isolation="inline", track_memory=False, device="cpu")


def test_stopped_search_resumes_from_the_store_without_repeating_and_verifies_the_truth(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    stop = threading.Event()
    seen: list[dict[str, Any]] = []

    def after_two(update: dict[str, Any]) -> None:
        if update["event"] == "trial":
            seen.append(update["trial"])
            if len(seen) >= 2:
                stop.set()

    protocol = Protocol(design="processes", precision=0.1)
    first = tune(sleepy_workload(), budget_s=60, space=SPACE, protocol=protocol, store=path, cancel=stop,
                 on_update=after_two, **WINDOW)  # fmt: skip
    assert first.stop_reason == "cancelled" and first.best() is None
    measured_first = {json.dumps(t.params, sort_keys=True) for t in first.trials if t.result is not None}
    assert len(measured_first) >= 2

    second = tune(sleepy_workload(), budget_s=60, space=SPACE, protocol=protocol, store=path, resume=True, **WINDOW)
    assert second.run_id == first.run_id and second.resumed_trials >= 2
    new = [t for t in second.trials if not t.resumed and t.stage == "screen"]
    assert not {json.dumps(t.params, sort_keys=True) for t in new} & measured_first, "resume repeated a trial"
    with Store(path) as store:
        stored = store.trials(run_id=second.run_id)
        run = store.run(second.run_id)
        assert run is not None and run["kind"] == "tune"
        assert json.loads(run["label"])["tune"]["seed"] == 0, "the stored run does not record the sampler's seed"
    screened = [json.dumps(TrainConfig.from_dict(t.result.config).to_dict(), sort_keys=True)
                for t in stored if t.label == "screen"]  # fmt: skip
    assert len(screened) == len(set(screened)), "a configuration was screened twice across the two sessions"
    assert sum(1 for t in stored if t.label == "baseline") == 1

    best = second.best()
    assert best is not None and best["winner"] and best["config"]["batch_size"] == 8
    # The truth: 1.5x per sample, up to 2x when a constant per-step cost (sleep overshoot on a busy
    # host, the optimizer) adds to both sides; never below 1.5x, never 2x or more.
    low, high = best["speedup_ci"]
    assert 1.5 / 1.1 < best["speedup"] < 2.0 and low < 2.0 and high > 1.5 / 1.1
    data = second.to_dict()
    assert {"best", "trials", "pareto", "budget_used_s", "runner_ups"} <= set(data)
    assert data["best"]["export"]["command"].startswith("workbench run")
    from workbench.cli.tune import summary

    text = summary(second)
    # optimizer_impl is neutral on this sleepy workload, so batch_size=8 with either implementation is a
    # legitimate tie; the text then says "tied at the top" instead of naming one "best".
    head = "tied at the top" if second.tied else "best: "
    assert head in text and "batch_size=8" in text and "Pareto front" in text and f"run {second.run_id}" in text


def test_a_crashing_configuration_is_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    """The workload's data raises at batch 2: a row with its reason, never retried."""

    def crashing_batches(n: int, g: torch.Generator) -> Any:
        if n == 2:
            raise RuntimeError("batch 2 is broken on purpose")
        return torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)

    wl = replace(sleepy_workload(), batch_fn=crashing_batches)
    result = tune(wl, budget_s=25, space={"batch_size": [2, 4, 8]}, store=tmp_path / "h.sqlite",
                  protocol=Protocol(design="processes", precision=0.1), seed_from_diagnosis=False, **WINDOW)  # fmt: skip
    crashed = [t for t in result.trials if t.params.get("batch_size") == 2]
    assert len(crashed) == 1 and crashed[0].status == "error" and "broken on purpose" in crashed[0].reason
    assert any(t.feasible for t in result.trials)
    assert result.best() is not None  # the crash did not end the search


def test_tune_refuses_bad_input_before_any_trial() -> None:
    with pytest.raises(ConfigError, match="too small for even one round"):
        tune(sleepy_workload(), budget_s=5, space=SPACE, store=None, **WINDOW)
    with pytest.raises(ConfigError, match="below the model's parameters"):
        tune(sleepy_workload(), budget_s=60, space=SPACE, max_memory_bytes=8, store=None, **WINDOW)
    with pytest.raises(ConfigError, match="empty"):
        tune(sleepy_workload(), budget_s=60, space={}, store=None, **WINDOW)
    with pytest.raises(ConfigError, match="no earlier tune"):
        tune(sleepy_workload(), budget_s=60, space=SPACE, store=Path("/tmp") / f"wb-none-{time.time()}.sqlite", resume=True,
             **WINDOW)  # fmt: skip


def test_space_type_is_public() -> None:
    assert isinstance(user_space({"amp": ["fp32", "bf16"]}, "cpu"), SearchSpace)


def test_replay_keeps_pruned_and_failed_trials_but_not_ones_the_user_stopped() -> None:
    """Resume: a pruned or failed trial is finished (never retried); one the user cancelled is not."""
    space = user_space({"batch_size": [2, 4, 8]}, "cpu")
    screening = Screening(space, TrainConfig(), _result(14.0), Objective("throughput"), _FakeMeasure(), device="cpu")
    pruned = _result(30.0, status="cancelled", batch_size=2)
    pruned.message = "pruned after 3 timed steps: slow"
    stopped = _result(30.0, status="cancelled", batch_size=4)
    stopped.message = "cancelled by the caller"
    crashed = _result(30.0, status="oom", batch_size=8)
    crashed.message = "out of memory: CPU"
    assert screening.replay(pruned, "screen") is not None
    assert screening.replay(stopped, "screen") is None
    assert screening.replay(crashed, "screen") is not None
    assert {t.params["batch_size"]: t.status for t in screening.trials} == {2: "pruned", 8: "oom"}
    for _ in range(30):
        screening.step()
    measured = [c["batch_size"] for c in screening.measure.calls]  # type: ignore[attr-defined]
    assert measured == [4], "only the stopped configuration is measured again"


class _WideNet(nn.Module):
    """Activations grow with the batch (8192 features a sample): a memory limit caps the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.wide, self.out = nn.Linear(4, 8192), nn.Linear(8192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.004)
        return self.out(torch.relu(self.wide(x)))


def test_memory_limit_finds_the_largest_batch_then_verifies_it_with_one_trial(tmp_path: Path) -> None:
    from workbench.workloads import Workload

    wl = Workload.from_callables(
        model_fn=_WideNet,
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
        name="wide",
    )
    limit = 4 * 2**20
    window = {**WINDOW, "track_memory": True}
    result = tune(wl, budget_s=30, space={"batch_size": [2, 4, 256]}, max_memory_bytes=limit, store=None,
                  protocol=Protocol(design="processes", precision=0.1), seed_from_diagnosis=False, **window)  # fmt: skip
    largest = result.largest_batch
    assert largest is not None and 4 <= largest["estimated"] < 256
    assert largest["status"] == "ok" and largest["peak_memory_bytes"] <= limit  # the trial confirms the estimate
    big = [t for t in result.trials if t.params.get("batch_size") == 256]
    assert all(t.status == "over-memory" and t.result is None for t in big), "256 was run despite the estimate"
    assert all((t.peak_memory_bytes or 0) <= limit for t in result.trials if t.feasible)


def test_the_compiler_levers_are_searched_where_compile_is() -> None:
    space = default_space(8, "cpu", cpu_cores=2)
    assert space.values["activation_memory_budget"] == (1.0, 0.5)  # off first: the baseline's value
    assert space.values["compiled_autograd"] == (False, True)
    assert space.values["float8"] == ("off",) and space.values["activation_offload"] == ("off",)  # CPU: why in caps
    no_compile = default_space(8, "cpu", cpu_cores=2).narrowed({"compile": ["off"]}, device="cpu")
    widened = user_space({"activation_memory_budget": [1.0, 0.25]}, "cpu")
    assert widened.values["activation_memory_budget"] == (1.0, 0.25)
    with pytest.raises(ConfigError, match="from 0 to 1"):
        user_space({"activation_memory_budget": [1.0, 2]}, "cpu")
    # A budget without compile is refused by validation, so never run: only compiled points count.
    budget_without_compile = {**{n: v[0] for n, v in no_compile.values.items()}, "activation_memory_budget": 0.5}
    with pytest.raises(ConfigError, match="compile=off"):
        no_compile.config(TrainConfig(), budget_without_compile)


def test_a_cancel_during_verification_reports_cancelled_not_a_verdict() -> None:
    """A cancel that interrupts the protocol's rung says so; the rung's partial rows prove nothing."""
    from sleepy_workload import SleepyNet

    stop = threading.Event()
    screened: list[dict[str, Any]] = []

    def model_cancelling_once_screened() -> nn.Module:
        if len(screened) == 3:  # the three batch sizes are screened: this model is the verification's
            stop.set()
        return SleepyNet()

    wl = replace(sleepy_workload(), model_fn=model_cancelling_once_screened)
    result = tune(wl, budget_s=60, space={"batch_size": [2, 4, 8]}, protocol=Protocol(design="processes", precision=0.1),
                  store=None, seed_from_diagnosis=False, cancel=stop, on_update=lambda u: screened.extend(
                      [u["trial"]] if u["event"] == "trial" else []), **WINDOW)  # fmt: skip
    assert len(screened) == 3 and stop.is_set() and result.rungs, "the cancel must land inside the verification"
    assert result.stop_reason == "cancelled", result.stop_reason
    assert result.rungs[-1].interrupted and result.to_dict()["rungs"][-1]["interrupted"] is True
    cancelled_first = threading.Event()
    cancelled_first.set()
    before = tune(sleepy_workload(), budget_s=60, space=SPACE, store=None, cancel=cancelled_first, **WINDOW)
    assert before.stop_reason == "cancelled", before.stop_reason  # not "the baseline failed"


def test_the_best_comes_from_the_last_rung_that_finished_never_an_interrupted_one() -> None:
    """A rung cancelled between rounds still has rows with speedups (the rounds done so far), but
    it decides nothing: the best is the last finished rung's, or none."""
    from workbench.analysis.compare import UnitLog, compare_units
    from workbench.protocol import ComparisonRun
    from workbench.tune.result import TuneResult
    from workbench.tune.verify import Rung

    a, b = TrainConfig(batch_size=2), TrainConfig(batch_size=8)
    base = TrialSummary("b", TrainConfig().to_dict(), "ok", "", 1, 100.0, 1.0, None, 1, 0.1, 0.0, 1.0)
    ok = NumericsCheck(True, 0.0, 0.01, 0.0, 0.05, "")

    def rung(name: str, a_ms: float, b_ms: float, rounds: int) -> Rung:
        log = UnitLog()
        for r in range(rounds):
            log.add(0, r, [100.0])
            log.add(1, r, [a_ms])
            log.add(2, r, [b_ms])
        comp = compare_units([base, base, base], [ok, ok], log, paired=True, design="paired")
        return Rung(name, [a, b], ComparisonRun(comp, [], [[], []]), comp.candidates, comp.winner, comp.tied)

    finished = rung("rung 1", 80.0, 90.0, rounds=8)  # a wins: 1.25x every round
    cut = rung("verification", 95.0, 70.0, rounds=3)  # b leads after 3 rounds: too few to verify
    cut.interrupted = True
    result = TuneResult("w", "tiny", Objective(), user_space({"batch_size": [2, 8]}, "cpu"), 2, 60.0, None)
    result.rungs = [finished, cut]
    best = result.best()
    assert best is not None and best["winner"] is True and best["config"]["batch_size"] == 2
    result.rungs = [cut]
    assert cut.rows[1].speedup is not None and result.best() is None and result.runner_ups() == []
