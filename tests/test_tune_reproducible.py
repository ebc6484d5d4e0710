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

SLOW_DATA = """
import time

import torch
from torch import nn

from workbench.workloads import Workload


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(0.006)  # a decode: the step waits for its data
        return torch.randn(16, generator=torch.Generator().manual_seed(index)), torch.tensor(index % 4)


def collate(samples):
    return torch.utils.data.default_collate(samples)


workload = Workload.from_callables(
    model_fn=lambda: nn.Linear(16, 4), loss_fn=lambda output, batch: nn.functional.cross_entropy(output, batch[1]),
    dataset_fn=SlowDataset, collate_fn=collate, batch_size=4,
)
"""


def test_the_diagnosis_recommendations_are_measured_first_and_the_verified_one_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slow_tune.py").write_text(SLOW_DATA)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")  # the trial workers import the workload too
    updates: list[dict[str, Any]] = []
    space = {"num_workers": [0, 2], "persistent_workers": [False, True], "channels_last": [False, True]}
    result = tune("slow_tune:workload", budget_s=75, space=space, steps=4, warmup=1, store=None,
                  on_update=updates.append)  # fmt: skip
    found = result.recommended
    assert found is not None and found.candidates, result.notes
    loader_advice = [c for c in found.candidates if c["changes"].get("num_workers")]
    assert loader_advice, found.to_dict()
    trials = [u["trial"] for u in updates if u["event"] == "trial"]
    assert trials[0]["config"]["num_workers"] > 0, "the recommendation is the first configuration measured"
    assert found.rung is not None and found.rung.name == "recommendations"
    assert any(c.num_workers > 0 for c in found.helped), found.to_dict()  # 24 ms of data a step, ~0 compute
    best = result.best()
    assert best is not None and best["config"]["num_workers"] > 0, result.to_dict()["rungs"]
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
