"""The protocol's pure rules: block shapes, round order and when the rounds stop."""

from __future__ import annotations

import pytest

from workbench.config import ConfigError
from workbench.protocol import CLOSING_S, Protocol, round_order, stop_reason


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
