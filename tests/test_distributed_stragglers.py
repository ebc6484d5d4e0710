"""The straggler in a distributed trial, on real gloo ranks: a fixed delay in one rank's data loading,
forward, backward or optimizer step names that rank and that phase (2 and 3 ranks, the fault on rank 0
and on another rank); no-fault trials name none, also with CPU burners beside them.

Three ranks time-share this 2-core machine: WORKBENCH_CPU_RANKS_MAX lets them run for their behaviour.
"""

from __future__ import annotations

import pytest
from straggler_workload import cpu_burners, straggler_workload

from workbench.analysis.diagnose import diagnose
from workbench.analysis.ranks import straggler_check
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.trials import run_trial

DELAY_S = 0.03


def trial(phase: str | None, slow: int, world: int) -> TrialResult:
    result = run_trial(
        straggler_workload(phase, slow, DELAY_S),
        TrainConfig(strategy="ddp", nproc_per_node=world),
        warmup=2,
        steps=12,
        device="cpu",
        timeout_s=180,
    )
    assert result.status == "ok", result.message
    return result


@pytest.fixture(autouse=True)
def three_ranks_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_CPU_RANKS_MAX", "3")


@pytest.mark.parametrize(
    ("phase", "slow", "world"),
    [
        ("data", 1, 2),
        ("data", 0, 3),
        ("forward", 0, 2),
        ("forward", 1, 3),
        ("backward", 2, 3),
        ("backward", 0, 2),
        ("optimizer", 0, 3),
        ("optimizer", 1, 2),
    ],
)
def test_a_delayed_phase_on_one_rank_names_that_rank_and_that_phase(phase: str, slow: int, world: int) -> None:
    result = trial(phase, slow, world)
    check = straggler_check(result)
    assert check is not None and check.straggler == slow and check.cause == phase, check and check.reasons
    assert 0.8 * DELAY_S * 1000 <= check.late_ms <= 1.5 * DELAY_S * 1000, check.late_ms
    # the others' waiting is the straggler's cost, and the communication itself is what the latest waits
    assert check.others_wait_ms is not None and check.others_wait_ms >= 0.8 * DELAY_S * 1000
    assert check.comm_ms is not None and check.comm_ms < check.others_wait_ms / 2
    diagnosis = diagnose(result)
    primary = diagnosis.findings[0]
    assert primary.title.startswith(f"straggler: rank {slow}"), diagnosis.to_text()
    assert f"rank {slow} arrives" in primary.summary and primary.evidence["cause"] == phase
    assert [f.title for f in diagnosis.findings if f.kind == "data"] == []  # no second, rankless data finding


@pytest.mark.parametrize(
    ("strategy", "norm", "phase"), [("ddp", True, "data"), ("fsdp2", False, "data"), ("fsdp2", False, "optimizer")]
)
def test_a_straggler_is_named_where_the_others_wait_at_the_forward_s_entry(
    strategy: str, norm: bool, phase: str
) -> None:
    """DDP broadcasts BatchNorm buffers, FSDP2 all-gathers parameters, as each forward begins: there the
    others wait for a rank late with its data, not in the gradient sync."""
    workload = straggler_workload(phase, 1, DELAY_S, norm=norm)
    result = run_trial(workload, TrainConfig(strategy=strategy, nproc_per_node=2), warmup=2, steps=12, device="cpu")
    assert result.status == "ok", result.message
    check = straggler_check(result)
    assert check is not None and check.straggler == 1 and check.cause == phase, check and check.reasons
    assert 0.8 * DELAY_S * 1000 <= check.late_ms <= 1.5 * DELAY_S * 1000


@pytest.mark.parametrize(("world", "burners"), [(2, 0), (3, 0), (2, 0), (2, 1), (2, 2)])
def test_no_fault_names_no_straggler_even_beside_cpu_burners(world: int, burners: int) -> None:
    with cpu_burners(burners):
        result = trial(None, 0, world)
    check = straggler_check(result)
    assert check is not None and check.straggler is None, check and check.reasons
    text = diagnose(result).to_text()
    assert "straggler: rank" not in text, text
