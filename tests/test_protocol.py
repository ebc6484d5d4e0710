"""The protocol's rules: block shapes, round order, when the rounds stop, and which comparisons
may not run paired (shown on a real compiled model)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.protocol import CLOSING_S, Protocol, round_order, stop_reason
from workbench.workloads.base import Workload


@pytest.mark.parametrize(
    ("step_ms", "shape"),
    [
        (None, (5, True)),  # not characterized yet: the full block
        (20.0, (5, True)),  # fast: capped at block_steps
        (200.0, (5, True)),  # 5 x 200 ms = block_s exactly
        (230.0, (5, True)),  # 4 would be 0.92 s, short of block_s
        (400.0, (3, True)),
        (999.0, (2, True)),
        (1000.0, (1, True)),  # one step is block_s: still worth a switch step
        (1200.0, (1, False)),  # one step exceeds block_s: no switch step
    ],
)
def test_a_slow_configuration_gets_a_shorter_block(step_ms: float | None, shape: tuple[int, bool]) -> None:
    assert Protocol().block_for(step_ms) == shape


def test_block_shape_follows_the_protocol_settings() -> None:
    assert Protocol(block_s=3.0, block_steps=10).block_for(400.0) == (8, True)
    assert Protocol(block_steps=1).block_for(10.0) == (1, True)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [("block_s", 0.0, "block_s must be a positive"), ("block_steps", 0, "block_steps must be an integer"),
     ("precision", 0.9, "precision must be a fraction"), ("budget_s", -1, "budget must be a positive")],
)  # fmt: skip
def test_bad_protocol_settings_say_what_is_wrong(field: str, value: float, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Protocol(**{field: value})


def test_rounds_alternate_their_order() -> None:
    assert [round_order([0, 1, 2], n) for n in range(3)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]


def test_rounds_stop_on_precision_max_rounds_or_budget_never_before_the_floor() -> None:
    p = Protocol(budget_s=30, max_rounds=10)
    assert stop_reason(p, 6, 5, 0, 100.0, [1.0]) == ""  # below the floor, even out of budget and precise
    assert "within ±3.0%" in stop_reason(p, 6, 6, 0, 1.0, [1.0])
    assert "max_rounds=10" in stop_reason(p, 6, 10, 2, 1.0, [1.0])
    typical = 5.0
    assert stop_reason(p, 6, 6, 2, 30 - typical - CLOSING_S - 0.1, [typical]) == ""
    assert "budget of 30 s" in stop_reason(p, 6, 6, 2, 30 - typical - CLOSING_S + 0.1, [typical])
    # The next round is budgeted at the rounds' 90th percentile: one long round in ten counts.
    rounds = [4.0] * 9 + [6.0] * 2
    assert stop_reason(p, 6, 8, 2, 30 - 6.0 - CLOSING_S - 0.1, rounds) == ""
    assert "budget of 30 s" in stop_reason(p, 6, 8, 2, 30 - 6.0 - CLOSING_S + 0.1, rounds)


# --- settings dynamo does not guard never share a paired worker -------------------------------

AOT = {"compile": "default", "compile_backend": "aot_eager_decomp_partition"}


def test_compiled_configurations_differing_in_an_unguarded_setting_are_never_paired() -> None:
    from workbench.protocol import paired_refusal, run_protocol

    budgets = [TrainConfig(**AOT), TrainConfig(**AOT, activation_memory_budget=0.5)]
    reason = paired_refusal(budgets)
    assert reason is not None and "activation_memory_budget (0.5, 1.0)" in reason and "dynamo" in reason
    assert paired_refusal([TrainConfig(**AOT), TrainConfig(**AOT, amp="bf16")]) is None  # autocast is guarded
    assert paired_refusal([TrainConfig(), TrainConfig(**AOT, activation_memory_budget=0.5)]) is None  # one compiled
    with pytest.raises(ConfigError, match="design='paired' is not honest here: the compiled configurations differ"):
        run_protocol("bev-perception", budgets[0], budgets[1:], Protocol(design="paired"), store=None)


def gated_workload() -> Workload:
    """A Linear on `x * gate`, where `gate` is 40 pointwise ops on the detached input. Backward
    needs `gate`: at budget 1.0 it is saved, at 0.0 the partitioner saves only the input and
    recomputes the chain, about doubling the step (17 -> 35 ms measured on this 2-core host)."""

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(256, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gate = x.detach()
            for _ in range(40):
                gate = torch.sin(gate) * 1.01
            return self.linear(x * gate)

    return Workload.from_callables(
        Gated,
        lambda out, batch: F.mse_loss(out, batch[1]),
        batch_fn=lambda n, g: (torch.randn(n, 256, 256, generator=g), torch.randn(n, 256, 8, generator=g)),
        batch_size=8,
        name="gated-by-a-chain",
    )


@pytest.mark.slow
def test_a_compare_of_memory_budgets_shows_the_recompute() -> None:
    """Budget 0.0 recomputes a 40-op chain that budget 1.0 saves: the candidate must come out
    slower. In one paired worker both sides timed the graph compiled first: 0.93x measured here,
    against 0.23x in fresh processes (6 fresh workers, 40-140 s on 2 busy cores)."""
    from workbench.api import run_comparison

    protocol = Protocol(precision=0.05, budget_s=60, confidence=0.75, min_rounds=3, max_rounds=3)
    outcome = run_comparison(gated_workload(), TrainConfig(**AOT), [TrainConfig(**AOT, activation_memory_budget=0.0)],
                             protocol=protocol, steps=5, warmup=1, track_memory=False, store=None)  # fmt: skip
    comparison = outcome.comparison
    (row,) = comparison.candidates
    assert row.speedup is not None and row.speedup < 0.75, (comparison.design, row.speedup, row.speedup_ci)
    assert comparison.design == "processes", comparison.stop_reason
