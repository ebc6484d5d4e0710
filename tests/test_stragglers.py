"""The straggler rule against simulated ranks with a known truth: no-fault worlds name no straggler at
the stated rate, a delay of 10% of the step in one phase names that rank and that phase, tiny
differences never count, and a busy host is reported instead of a rank its contention slowed.

The simulation is the model the rule reads: ranks leave each synchronization together, so a rank
late by d makes every other rank wait d (plus the transfer), and noise is per rank and step."""

from __future__ import annotations

import random

import pytest

from workbench.analysis.stragglers import ALPHA, HostLoad, RankSteps, check_stragglers

STEP_MS, COMM_MS, NOISE_MS = 100.0, 2.0, 3.0
BASE = {"data": 5.0, "forward": 30.0, "backward": 45.0, "optimizer": 10.0}


def simulate(
    world: int,
    steps: int,
    rng: random.Random,
    slow: int | None = None,
    phase: str = "data",
    delay_ms: float = 0.0,
    how: str = "asleep",
) -> list[RankSteps]:
    """Ranks whose phases carry independent noise; `slow` spends `delay_ms` more in `phase`, `how`:
    'asleep' (off its core: a sleep, a slow read), 'computing' (on its core longer) or 'starved'
    (runnable, waiting for a core). Forward, backward compute and optimizer run on the core."""
    fields = (*BASE, "step", "wait", "cpu", "cpu_wait")
    per_rank: list[dict[str, list[float]]] = [{k: [] for k in fields} for _ in range(world)]
    for _ in range(steps):
        own = []
        for r in range(world):
            phases = {k: max(0.0, v + rng.gauss(0.0, NOISE_MS / 2)) for k, v in BASE.items()}
            if r == slow:
                phases[phase] += delay_ms
            own.append(phases)
        arrival = [sum(p.values()) for p in own]
        last = max(arrival)
        for r, phases in enumerate(own):
            wait = last - arrival[r] + COMM_MS + abs(rng.gauss(0.0, 0.2))
            row = per_rank[r]
            for k, v in phases.items():
                row[k].append(v + (wait if k == "backward" else 0.0))  # the wait sits inside backward
            row["step"].append(sum(phases.values()) + wait)
            row["wait"].append(wait)
            on_core = phases["forward"] + phases["backward"] + phases["optimizer"]
            if r == slow and how != "computing" and phase != "data":
                on_core -= delay_ms  # the delay was not spent on the core
            row["cpu"].append(on_core)
            row["cpu_wait"].append(0.1 + (delay_ms if r == slow and how == "starved" else 0.0))
    return [
        RankSteps(
            r,
            list(range(steps)),
            row["step"],
            {k: list(row[k]) for k in BASE},
            list(row["wait"]),
            cpu_ms=list(row["cpu"]),
            cpu_wait_ms=list(row["cpu_wait"]),
        )
        for r, row in enumerate(per_rank)
    ]


@pytest.mark.parametrize("world", [2, 3, 8])
def test_no_fault_worlds_name_no_straggler_beyond_the_stated_rate(world: int) -> None:
    rng = random.Random(world)
    runs = 300
    named = sum(check_stragglers(simulate(world, 20, rng)).straggler is not None for _ in range(runs))  # type: ignore[union-attr]
    assert named / runs <= ALPHA, f"{named} false stragglers in {runs} no-fault worlds of {world}"


@pytest.mark.parametrize("phase", ["data", "forward", "backward", "optimizer"])
@pytest.mark.parametrize(("world", "slow"), [(2, 0), (2, 1), (3, 0), (3, 2)])
def test_a_delay_of_a_tenth_of_the_step_names_the_rank_and_its_phase(phase: str, world: int, slow: int) -> None:
    rng = random.Random(hash((phase, world, slow)) % 1000)
    found = [check_stragglers(simulate(world, 20, rng, slow, phase, 0.1 * STEP_MS)) for _ in range(20)]
    assert all(c is not None for c in found)
    hits = [c for c in found if c is not None and c.straggler == slow and c.cause == phase]
    assert len(hits) >= 19, [(c.straggler, c.cause, c.reasons) for c in found if c is not None]
    # the cost is attributed: the others wait about the delay (plus the transfer) for it
    assert all(abs((c.others_wait_ms or 0.0) - 0.1 * STEP_MS - COMM_MS) < 3 * NOISE_MS for c in hits)
    assert all(abs(c.late_ms - 0.1 * STEP_MS) < 3 * NOISE_MS for c in hits)
    assert all(c.comm_ms is not None and c.comm_ms < 2 * COMM_MS for c in hits)  # its own wait: the transfer


def test_a_consistent_but_tiny_lateness_is_never_a_straggler() -> None:
    """0.3 ms at a 100 ms step, every step, no noise: consistent, significant, and too small to matter."""
    rng = random.Random(1)
    quiet = [RankSteps(r.rank, r.steps, r.step_ms, r.phases, [w - (0.3 if r.rank == 1 else 0.0) for w in r.wait_ms or []])
             for r in simulate(2, 40, rng)]  # fmt: skip
    check = check_stragglers(quiet)
    assert check is not None and check.straggler is None
    assert any("threshold" in reason for reason in check.reasons)


def test_a_busy_host_is_reported_instead_of_the_rank_its_contention_slowed() -> None:
    rng = random.Random(2)
    busy = HostLoad(busy_cores=2.0, ranks_cores=1.0, cores=2)
    # late while waiting for a core, or computing longer on a shared one: the neighbours can do that
    for how in ("starved", "computing"):
        slowed = simulate(2, 20, rng, slow=1, phase="forward", delay_ms=15.0, how=how)
        check = check_stragglers(slowed, [busy])
        assert check is not None and check.straggler is None and check.contention == busy, (how, check)
    # late while off its core (asleep, a slow read): its own doing, named even on the busy host
    for phase in ("data", "forward"):
        named = check_stragglers(simulate(2, 20, rng, slow=1, phase=phase, delay_ms=15.0), [busy])
        assert named is not None and named.straggler == 1 and named.cause == phase
        assert named.off_core_ms is not None and named.off_core_ms > 10.0
    # on a quiet host, a rank starved by its own threads is named with that cause; one computing longer
    # is named with its phase
    quiet = [HostLoad(busy_cores=1.0, ranks_cores=1.0, cores=2)]
    starved = check_stragglers(simulate(2, 20, rng, slow=1, phase="forward", delay_ms=15.0, how="starved"), quiet)
    assert starved is not None and starved.straggler == 1 and starved.cause == "cpu"
    slower = check_stragglers(simulate(2, 20, rng, slow=0, phase="backward", delay_ms=25.0, how="computing"), quiet)
    assert slower is not None and slower.straggler == 0 and slower.cause == "backward"


def test_a_rank_computing_a_tenth_longer_is_within_the_spread_of_identical_cpu_ranks() -> None:
    """On-core lateness under 20% of the step is what two identical ranks' processes differ by on CPU
    cores; the same lateness spent off the core (a sleep, a slow read) is named."""
    rng = random.Random(5)
    computing = check_stragglers(simulate(2, 40, rng, slow=1, phase="forward", delay_ms=10.0, how="computing"))
    assert computing is not None and computing.straggler is None
    assert any("computing on its core" in reason for reason in computing.reasons)
    asleep = check_stragglers(simulate(2, 40, rng, slow=1, phase="forward", delay_ms=10.0, how="asleep"))
    assert asleep is not None and asleep.straggler == 1 and asleep.cause == "forward"


def test_too_few_steps_claim_nothing_and_say_so() -> None:
    check = check_stragglers(simulate(2, 4, random.Random(3), slow=1, delay_ms=50.0))
    assert check is not None and check.straggler is None and "steps" in check.reasons[-1]
    assert check_stragglers(simulate(1, 10, random.Random(3))) is None


def test_without_a_measured_wait_the_lateness_comes_from_the_phases_before_backward() -> None:
    ranks = simulate(2, 20, random.Random(4), slow=0, phase="data", delay_ms=20.0)
    blind = [RankSteps(r.rank, r.steps, r.step_ms, r.phases) for r in ranks]
    check = check_stragglers(blind)
    assert check is not None and not check.wait_measured and check.straggler == 0 and check.cause == "data"
    assert any("not measured" in reason for reason in check.reasons)
