"""Auto-tune gives the same answer twice: the diagnosis's recommendations are measured first and verified
by the protocol (never dropped on one noisy screening trial), and the seeded sampler proposes the same
configurations in the same order for the same inputs and seed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.tune import tune, user_space
from workbench.tune.objective import Objective
from workbench.tune.screening import Screening

ROOT = Path(__file__).resolve().parents[1]

SMALL_OPS = """
import torch
from torch import nn

from workbench.workloads import Workload


class ManySmallOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(40))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


workload = Workload.from_callables(
    model_fn=ManySmallOps, batch_fn=lambda n, generator: torch.randn(n, 8, generator=generator),
    loss_fn=lambda out, batch: out.pow(2).mean(), batch_size=2,
)
"""


def test_the_diagnosis_recommendations_are_measured_first_and_the_verified_ones_combined_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """80 tiny parameters updated one by one and a batch of 2: an overhead-bound step, whose diagnosis
    recommends the foreach optimizer and a 4x batch. Both pair in one worker, so the recommendations
    rung fits a one-minute budget; each helps on its own (fewer ops per parameter; fixed costs per
    sample), so the protocol verifies both and their combination wins."""
    (tmp_path / "small_ops.py").write_text(SMALL_OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")  # the trial workers import the workload too
    updates: list[dict[str, Any]] = []
    space = {"optimizer_impl": ["for-loop", "foreach"], "batch_size": [2, 8], "channels_last": [False, True]}
    result = tune("small_ops:workload", baseline=TrainConfig(optimizer_impl="for-loop"), budget_s=60, space=space,
                  steps=10, warmup=1, store=None, on_update=updates.append)  # fmt: skip
    found = result.recommended
    assert found is not None and found.candidates, result.notes
    advice = [c["changes"] for c in found.candidates]
    assert {"optimizer_impl": "foreach"} in advice and {"batch_size": 8} in advice, advice
    trials = [u["trial"]["params"] for u in updates if u["event"] == "trial"]
    base = {"optimizer_impl": "for-loop", "batch_size": 2, "channels_last": False}
    changed = [{k: v for k, v in params.items() if base.get(k) != v} for params in trials[:2]]
    assert {"optimizer_impl": "foreach"} in changed and {"batch_size": 8} in changed, trials[:2]  # measured first
    assert found.rung is not None and found.rung.name == "recommendations", found.notes
    helped = {(c.optimizer_impl, c.batch_size) for c in found.helped}
    assert helped == {("foreach", 2), ("for-loop", 8)}, found.to_dict()
    best = result.best()
    assert best is not None, result.to_dict()["rungs"]
    assert (best["config"]["optimizer_impl"], best["config"]["batch_size"]) == ("foreach", 8), best
    data = result.to_dict()
    assert data["seed"] == 0 and data["sampler"] == "optuna TPESampler(seed=0)" and "tied" in data
    assert data["recommended"]["rung"]["name"] == "recommendations"


def _fake_measure(config: TrainConfig, on_event: Any, cancel: threading.Event) -> TrialResult:
    """A trial whose cost is a fixed function of the configuration: the sampler's choices alone vary."""
    cost = 10.0 + 3.0 * config.channels_last + 2.0 * (config.optimizer_impl == "foreach") + (config.batch_size or 4) / 4
    return TrialResult(trial_id="fake", status="ok", workload="w", config=config.to_dict(), step_ms=[cost] * 4,
                       losses=[1.0] * 5, samples_per_step=config.batch_size or 4, steps=4)  # fmt: skip


def _proposals(seed: int) -> list[dict[str, Any]]:
    space = user_space({"channels_last": [False, True], "optimizer_impl": ["for-loop", "foreach"],
                        "batch_size": [2, 4, 8], "num_workers": [0, 2]}, "cpu")  # fmt: skip
    base = _fake_measure(TrainConfig(), None, threading.Event())
    screening = Screening(space, TrainConfig(), base, Objective("step-time"), _fake_measure, seed=seed, device="cpu")
    for _ in range(12):
        screening.step()
    return [t.params for t in screening.trials]


def test_the_same_seed_proposes_the_same_configurations_in_the_same_order() -> None:
    first, again, other = _proposals(7), _proposals(7), _proposals(8)
    assert len(first) >= 8 and first == again
    assert other != first, "a different seed is a different search"


class _ReachedTheRung(Exception):
    def __init__(self, configs: list[TrainConfig]) -> None:
        self.configs = configs


@pytest.mark.parametrize(("warm_compile_s", "verified"), [(0.5, True), (30.0, False)])
def test_a_compile_recommendation_is_judged_by_a_warm_trial_not_the_cold_first_compile(
    monkeypatch: pytest.MonkeyPatch, warm_compile_s: float, verified: bool
) -> None:
    """The first compile on a fresh machine fills the compile cache the protocol's workers then load
    from, so a cold 30 s compile must not keep a compile recommendation out of the recommendations
    rung when a second, warm trial compiles in half a second; a compile still slow when warm stays out."""
    from workbench.protocol import Protocol
    from workbench.tune import record as rec
    from workbench.tune import search
    from workbench.tune.result import TuneResult

    compiled = TrainConfig(compile="default")
    measured: list[float] = []

    def measure(config: TrainConfig, on_event: Any, cancel: threading.Event) -> TrialResult:
        result = _fake_measure(config, on_event, cancel)
        if config.compile != "off":
            result.compile_time_s = 30.0 if not measured else warm_compile_s
            measured.append(result.compile_time_s)
        return result

    def reached(*args: Any, **kwargs: Any) -> None:
        raise _ReachedTheRung(list(args[4]))

    advice = [{"finding": "overhead", "title": "compile", "changes": {"compile": "default"}, "config": compiled}]
    monkeypatch.setattr(search, "recommended_configs", lambda *a: (advice, []))
    monkeypatch.setattr(search, "measure_rung", reached)
    space = user_space({"compile": ["off", "default"]}, "cpu")
    base = _fake_measure(TrainConfig(), None, threading.Event())
    goal = Objective("step-time")
    record = rec.TuneRecord(None, {}, resume=False)
    wl = search.load_workload("bev-perception", preset="tiny")
    run = search._Search(wl, TrainConfig(), space, goal, Protocol(), {"device": "cpu", "preset": "tiny"}, record,
                         threading.Event(), lambda update: None)  # fmt: skip
    run.began, run.budget_s, run.durations = 0.0, 180.0, [1.0]
    screening = Screening(space, TrainConfig(), base, goal, measure, device="cpu")
    result = TuneResult(workload="w", preset="tiny", objective=goal, space=space, valid_configs=2, budget_s=180.0,
                        run_id=None)  # fmt: skip
    if verified:
        with pytest.raises(_ReachedTheRung) as rung:
            run._recommended(screening, base, result)
        assert rung.value.configs == [compiled]
    else:
        found = run._recommended(screening, base, result)
        assert found.rung is None and any("compiled for 30 s" in note for note in found.notes), found.notes
    assert measured == [30.0, warm_compile_s]  # measured twice: cold, then warm
    assert screening.known[compiled.to_json(sort_keys=True)].compile_time_s == warm_compile_s
