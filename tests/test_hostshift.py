"""Verdicts on a busy host, on simulated paired rounds with a known truth and a known load.

Simulated step by step like a paired worker here: mirrored rounds (B C | C B, then C B | B C),
blocks of 3 steps of ~45 ms (two per configuration and round) with 5% step noise, a round-wide
speed factor (sd 5%), the block that opens a round 4% slower (as seen here). Other work switches on and off at known times; a step
that runs while it is on takes 1 + k times as long, k drawn per step (median 2, heavy-tailed:
A/A rounds under one burner read 0.2x–3.6x here). Each block records the share of its time the
load was on, in cores, plus reading noise — what `hostload.ArmMeter` measures.

Figures when these tests were written (300 comparisons of 20 rounds, margin 2%). False A/A
verdicts with every round kept at 95% (the rule before) → with the rounds whose load changed set
aside and, on a busy host, the interval at 99%: quiet 0.000 → 0.000, step halfway 0.047 → 0.000
(every verdict withheld), bursts 0.013 → 0.000, spikes 0.030 → 0.003, steady 0.037 → 0.007 (at
95% on a busy host: spikes 0.010, steady 0.040). A true 10% slowdown called slower: quiet 1.00 →
1.00, bursts 0.93 → 1.00, spikes 0.99 → 0.91 (9% withheld), steady 0.17 → 0.04 (a steady load
leaves the pairing alone but makes the rounds so noisy that few reach a verdict, fewer at 99%);
the interval covers the truth in 0.98–1.00 of those with one (withheld ones count as not
covering in the test). The simulation's failures before the rule are milder than the host's (5
in 20 there): it is a model of the mechanism, and `benchmarks/busy_host.py` measures the real thing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.analysis.compare import UnitLog, compare_units, estimate, shift, summarize
from workbench.analysis.hostshift import BUSY_CONFIDENCE, LOAD_GAP, LoadShift, load_shift
from workbench.analysis.intervals import paired_speedup, verdict_for
from workbench.analysis.numerics import check_numerics
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.protocol.compare import ComparisonRun
from workbench.protocol.rounds import mean_load, mirrored_order
from workbench.terminal import comparison_table, verdict_text

ROUNDS = 20
SIMULATIONS = 300
STEP_MS = 45.0


def _load_windows(rng: np.random.Generator, pattern: str, length_s: float) -> list[tuple[float, float]]:
    """When the other work is on, (start, end) in seconds."""
    if pattern == "quiet":
        return []
    if pattern == "step":  # switched on halfway, never off
        return [(length_s / 2, 1e9)]
    if pattern == "steady":
        return [(-1.0, 1e9)]
    if pattern == "bursts":  # two bursts of ~3 s
        starts = rng.uniform(0, length_s - 3.0, 2)
        return [(s, s + 3.0) for s in starts]
    starts = rng.uniform(0, length_s, 6)  # spikes: editors, file scans
    return [(s, s + 0.3) for s in starts]


def _on(t: float, windows: list[tuple[float, float]]) -> bool:
    return any(a <= t < b for a, b in windows)


def simulate(rng: np.random.Generator, pattern: str, true_ratio: float = 1.0) -> tuple[UnitLog, set[int]]:
    """One comparison's log, and the rounds in which the load switched on or off (the truth)."""
    length_s = ROUNDS * 4 * 3 * STEP_MS / 1000.0 * 1.1
    windows = _load_windows(rng, pattern, length_s)
    log, t, switched = UnitLog(), 0.0, set()
    for r in range(ROUNDS):
        shared = rng.normal(0.0, 0.05)
        steps: dict[int, list[float]] = {0: [], 1: []}
        loaded: dict[int, list[float]] = {0: [], 1: []}
        states = set()
        for position, config in enumerate(x for half in mirrored_order([0, 1], r) for x in half):
            block_s, on_s = 0.0, 0.0
            for _ in range(3):  # a half block (`rounds.half_block` of 5 steps)
                ms = STEP_MS * np.exp(shared + rng.normal(0.0, 0.05)) / (true_ratio if config == 1 else 1.0)
                ms *= 1.04 if position == 0 else 1.0
                on = _on(t, windows)
                states.add(on)
                if on:
                    ms *= 1.0 + rng.lognormal(np.log(2.0), 0.8)
                t += ms / 1000.0
                block_s += ms / 1000.0
                on_s += ms / 1000.0 if on else 0.0
                steps[config].append(ms)
            loaded[config].append(on_s / block_s + abs(rng.normal(0.0, 0.03)))
        switched |= {r} if len(states) == 2 else set()
        for config in (0, 1):
            log.add(config, r, steps[config], mean_load([(x, None) for x in loaded[config]]))
    return log, switched


def verdicts(log: UnitLog) -> tuple[str, str, tuple[float, float] | None]:
    """(verdict keeping every round, verdict with the new rule, the new rule's interval) — as `_row` decides."""
    every = estimate(log, 0, 1, paired=True, confidence=0.95, set_aside=False)
    kept = estimate(log, 0, 1, paired=True, confidence=0.95)  # at 99% on a busy host
    assert every is not None
    old = verdict_for(every, 0.02)
    if kept is None or shift(log, 0, 1).withheld:
        return old, "inconclusive", None
    return old, verdict_for(kept, 0.02), kept.ci


@pytest.mark.parametrize("pattern", ["quiet", "step", "bursts", "spikes", "steady"])
def test_aa_false_verdicts_stay_at_the_nominal_rate_under_every_load_pattern(pattern: str) -> None:
    rng = np.random.default_rng(44)
    false = sum(verdicts(simulate(rng, pattern)[0])[1] in ("faster", "slower") for _ in range(SIMULATIONS))
    # 95% intervals: 5% nominal; 0.08 leaves room for Monte Carlo noise (sd 1.3% at 300).
    assert false / SIMULATIONS <= 0.08, f"{pattern}: {false}/{SIMULATIONS} false verdicts"


@pytest.mark.parametrize("pattern", ["quiet", "bursts"])
def test_a_true_ten_percent_slowdown_is_still_called_and_covered(pattern: str) -> None:
    rng = np.random.default_rng(10)
    truth = 1.0 / 1.10
    called = covered = 0
    for _ in range(SIMULATIONS):
        _, verdict, ci = verdicts(simulate(rng, pattern, truth)[0])
        called += verdict == "slower"
        covered += ci is not None and ci[0] <= truth <= ci[1]
    assert called / SIMULATIONS >= 0.85, f"{pattern}: called {called}/{SIMULATIONS}"
    assert covered / SIMULATIONS >= 0.90, f"{pattern}: covered {covered}/{SIMULATIONS}"


def test_the_rounds_the_load_switched_in_are_the_ones_set_aside() -> None:
    rng = np.random.default_rng(7)
    found = truth = flagged = 0
    for _ in range(100):
        log, switched = simulate(rng, "bursts")
        moved = set(shift(log, 0, 1).rounds)
        found += len(moved & switched)
        truth += len(switched)
        flagged += len(moved)
    assert found / truth >= 0.8, f"found {found} of {truth} rounds in which the load switched"
    # Rounds wholly inside a burst are set aside too (busier than usual); quiet ones are not.
    assert flagged < 0.35 * 100 * ROUNDS


def test_a_load_step_halfway_withholds_the_verdict_and_says_so() -> None:
    log, _ = simulate(np.random.default_rng(3), "step")
    fake = TrialResult(trial_id="t", status="ok", workload="w", config=TrainConfig().to_dict(), step_ms=[STEP_MS] * 5)
    summaries = [summarize([fake]), summarize([fake])]
    comp = compare_units(summaries, [check_numerics(fake, fake)], log, paired=True, design="paired")
    row = comp.candidates[0]
    assert row.verdict == "inconclusive"
    assert row.verdict_note.startswith("the host's load changed during the comparison")
    assert len(row.load_changed_rounds) > ROUNDS / 3
    assert comp.noise.load_changed_rounds == row.load_changed_rounds
    change = comp.noise.load_changes[0]
    assert change["round"] == row.load_changed_rounds[0] and change["candidate_cores"] >= 0.0
    assert any("the host's load changed" in w for w in comp.noise.warnings)
    # Where users look: the CLI's table (the app's verdict column prints the same words) and the JSON.
    outcome = ComparisonRun(comp, [fake], [[fake]], log)
    assert "inconclusive: the host's load changed during the comparison" in comparison_table(outcome)
    data = json.loads(json.dumps(outcome.to_dict()))
    assert data["candidates"][0]["load_changed_rounds"] == row.load_changed_rounds
    assert data["candidates"][0]["verdict"] == "inconclusive" and data["candidates"][0]["verdict_note"]
    assert data["noise"]["load_changes"][0]["round"] == row.load_changed_rounds[0]


def test_a_verdict_from_the_rounds_left_says_how_many_were_set_aside() -> None:
    rng = np.random.default_rng(5)
    log = UnitLog()
    for r in range(12):
        shared = rng.normal(0.0, 0.02)
        busy = r == 4  # other work during the candidate's blocks of round 4 only: 3x slower there
        log.add(0, r, [100.0 * np.exp(shared + rng.normal(0, 0.01))], (0.02, 0.01))
        log.add(
            1, r, [110.0 * (3.0 if busy else 1.0) * np.exp(shared + rng.normal(0, 0.01))], (1.0 if busy else 0.03, None)
        )
    fake = TrialResult(trial_id="t", status="ok", workload="w", config=TrainConfig().to_dict(), step_ms=[100.0])
    comp = compare_units([summarize([fake])] * 2, [check_numerics(fake, fake)], log, paired=True, design="paired")
    row = comp.candidates[0]
    assert row.verdict == "slower" and row.load_changed_rounds == [4] and row.units == 11
    assert row.interval_confidence == BUSY_CONFIDENCE
    assert verdict_text(row) == "slower (1 round set aside: the host's load changed) (99% interval: the host was busy)"


def test_a_busy_host_takes_the_interval_at_99_percent_a_quiet_one_at_the_asked_confidence() -> None:
    """The interval is the signed-rank interval of the kept rounds at 99% — the same function
    asked for 99% directly — wherever the load changed in a round or stayed above the line."""
    rng = np.random.default_rng(8)
    medians = {r: 100.0 * np.exp(rng.normal(0, 0.03)) for r in range(14)}
    cands = {r: 104.0 * np.exp(rng.normal(0, 0.03)) for r in range(14)}
    fake = TrialResult(trial_id="t", status="ok", workload="w", config=TrainConfig().to_dict(), step_ms=[100.0])
    for name, base_load, cand_load in [
        ("quiet", {r: (0.02, 0.01) for r in medians}, {r: (0.03, 0.0) for r in medians}),
        ("steady", {r: (1.0, 0.9) for r in medians}, {r: (1.05, 0.95) for r in medians}),
        ("changed", {r: (0.02, 0.01) for r in medians}, {r: (0.9 if r == 3 else 0.02, None) for r in medians}),
    ]:
        log = UnitLog()
        for r in medians:
            log.add(0, r, [medians[r]], base_load[r])
            log.add(1, r, [cands[r]], cand_load[r])
        moved = shift(log, 0, 1)
        kept = {r: v for r, v in medians.items() if r not in moved.rounds}
        assert moved.busy == (name != "quiet"), name
        confidence = BUSY_CONFIDENCE if moved.busy else 0.95
        expected = paired_speedup(kept, cands, confidence)
        got = estimate(log, 0, 1, paired=True, confidence=0.95)
        assert got is not None and got.ci == pytest.approx(expected.ci), name
        if moved.busy:  # wider than the asked 95% would have been
            narrower = paired_speedup(kept, cands, 0.95).ci
            assert got.ci[1] - got.ci[0] > narrower[1] - narrower[0], name
        comp = compare_units([summarize([fake])] * 2, [check_numerics(fake, fake)], log, paired=True, design="paired")
        row = comp.candidates[0]
        assert row.interval_confidence == (BUSY_CONFIDENCE if moved.busy else None), name
        data = json.loads(json.dumps(ComparisonRun(comp, [fake], [[fake]], log).to_dict()))
        assert data["candidates"][0]["interval_confidence"] == row.interval_confidence
        assert ("99% interval: the host was busy" in verdict_text(row)) == moved.busy, name


def test_the_rule_reads_loads_only() -> None:
    quiet = {r: (0.02, 0.01) for r in range(10)}
    busy_arm = dict(quiet) | {4: (0.02 + 2 * LOAD_GAP, None)}
    moved = load_shift(quiet, busy_arm, list(range(10)))
    assert moved.rounds == [4] and moved.measured == 10 and not moved.withheld
    assert load_shift({}, {}, list(range(10))) == LoadShift()  # not measured: nothing set aside
    steady = {r: (1.0, 0.9) for r in range(10)}
    assert load_shift(steady, steady, list(range(10))).rounds == []  # busy but steady: pairing holds


def test_rounds_are_mirrored_and_alternate() -> None:
    assert mirrored_order([0, 1], 0) == [[0, 1], [1, 0]]
    assert mirrored_order([0, 1, 2], 1) == [[2, 1, 0], [0, 1, 2]]
    assert mean_load([(0.2, 0.1), (0.4, None)]) == (pytest.approx(0.3), None)
