"""Which rank holds the others back, and why — claimed only with evidence.

Input: every rank's per-step phases (data, forward, backward, optimizer) and its time waiting
at the step's synchronizations (`workbench.measure.syncwait`). Ranks leave a synchronization
together, so the rank that waits least arrived last: a rank's lateness at step s is the most
any rank waited minus its own wait — no clocks compared across ranks or hosts. Its cause is the
phase in which it spends longer than the other ranks do, and the others' waiting is its cost.

A straggler is named only when (a) its median margin over the next-latest rank is at least
`MIN_SHARE` of the step and `MIN_MS`, (b) it is later than the others by more than chance allows
(a one-sided Wilcoxon signed-rank test over steps at `ALPHA`, Bonferroni over the ranks, since
the latest is chosen after looking), and (c) each third of the window agrees. On a host whose other processes took cores
the ranks needed, a late rank is reported as host contention instead of being blamed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer")
MIN_SHARE = 0.05
"""Lateness below this share of the median step is never a straggler (a 10% delay is found)."""
MIN_MS = 0.5
"""…nor below this many ms: a thread yield on a busy core costs a few tenths of a ms."""
COMPUTE_SHARE = 0.2
"""Lateness its thread spent computing on its core must reach this share of the step: identical
ranks on CPU cores differ by 5-10% of a compute-bound step for a process's whole life (memory
layout, thread placement; between-process spread of 10-20% measured here), so only lateness spent
off the core (asleep, waiting for a disk or its data — or, seen from the host, for its GPU) is
held to `MIN_SHARE`."""
ALPHA = 0.01
"""False-alarm level of the signed-rank test, shared by all ranks (each tested at ALPHA / ranks)."""
MIN_STEPS = 6
"""Fewer aligned steps than this cannot pass the test at ALPHA: nothing is claimed."""
BLOCKS = 3
CONTENTION_CORES = 0.5
"""Other processes' cores above which, with the ranks' own use, a host counts as contended."""
CONTENDED_SHARE = 0.75
"""…when the ranks' cores plus the others' reach this share of the host's cores."""

PHASE_WORDS = {
    "data": "data loading",
    "forward": "forward",
    "backward": "backward compute",
    "optimizer": "optimizer step",
    "other": "code between the phases",
    "cpu": "waiting for a CPU core",
    "unexplained": "unexplained",
}


@dataclass(frozen=True)
class RankSteps:
    """One rank's aligned steps: per-step `step_ms`, phases and synchronization waits (ms)."""

    rank: int
    steps: list[int]
    step_ms: list[float]
    phases: dict[str, list[float | None]]
    """'data', 'forward', 'backward' (its synchronization wait included), 'optimizer'."""
    wait_ms: list[float | None] | None = None
    """All waiting at the step's synchronizations; None when not measured."""
    phase_wait_ms: dict[str, list[float | None]] | None = None
    """The parts of `wait_ms` inside a phase: 'forward' (DDP's buffer broadcast, FSDP2's all-gather at
    its entry), 'backward' (the gradient sync); without it, all of `wait_ms` is inside backward."""
    host: str = ""
    cpu_ms: list[float | None] | None = None
    """Time its training thread was on a core; None when not measured."""
    cpu_wait_ms: list[float | None] | None = None
    """Time its training thread was runnable but had no core (the run queue); None when not measured."""


@dataclass(frozen=True)
class HostLoad:
    """A host's cores while the ranks ran: its busy cores, the ranks' own, and the total."""

    busy_cores: float
    ranks_cores: float
    cores: int
    host: str = ""

    @property
    def other_cores(self) -> float:
        return max(0.0, self.busy_cores - self.ranks_cores)

    @property
    def contended(self) -> bool:
        return self.other_cores >= CONTENTION_CORES and (
            self.ranks_cores + self.other_cores >= CONTENDED_SHARE * self.cores
        )


@dataclass(frozen=True)
class RankPace:
    """A rank's medians over the aligned steps (ms); `late_ms`: how long after the first it arrives."""

    rank: int
    step_ms: float
    """Its median step, with waits outside the step's clock (`_cycle_ms`)."""
    data_ms: float | None
    forward_ms: float | None
    backward_ms: float | None
    """Backward compute: the gradient sync's wait taken out where it was measured (forward: its entry's)."""
    optimizer_ms: float | None
    other_ms: float | None
    wait_ms: float | None
    late_ms: float
    cpu_ms: float | None = None
    cpu_wait_ms: float | None = None


@dataclass
class StragglerCheck:
    """The verdict on a set of ranks, with the numbers behind it either way."""

    straggler: int | None
    cause: str | None
    """'data', 'forward', 'backward', 'optimizer', 'other', 'cpu' (starved of cores), or 'unexplained'."""
    late_ms: float
    """The latest rank's median margin over the next-latest."""
    step_ms: float
    steps: int
    latest_steps: int
    """Steps in which that rank arrived last."""
    p_value: float
    threshold_ms: float
    excess_ms: dict[str, float]
    """Per phase, how much longer the latest rank takes than the other ranks' median."""
    others_wait_ms: float | None
    """The median time the other ranks wait at synchronizations per step."""
    comm_ms: float | None
    """The latest rank's own wait: the communication itself, no rank to wait for."""
    wait_measured: bool
    ranks: list[RankPace]
    candidate: int | None
    contention: HostLoad | None = None
    cpu_wait_excess_ms: float | None = None
    """How much longer than the other ranks the latest one waited for a CPU core, per step."""
    off_core_ms: float | None = None
    """How much of its lateness it spent neither on a core nor waiting for one (asleep, blocked on I/O)."""
    reasons: list[str] = field(default_factory=list)
    """Why a straggler was or was not named, one clause each."""

    @property
    def share(self) -> float:
        return self.late_ms / self.step_ms if self.step_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["share"] = self.share
        return data

    def sentence(self) -> str:
        """One sentence for the named straggler: who, how late, why, and what it costs the others."""
        if self.straggler is None or self.cause is None:
            return ""
        rank, late = self.straggler, self.late_ms
        because = _cause_words(self)
        cost = ""
        if self.others_wait_ms is not None:
            cost = f"; the other ranks wait {self.others_wait_ms:.1f} ms a step for it at the synchronization"
        return (
            f"rank {rank} arrives {late:.1f} ms ({self.share:.0%} of a {self.step_ms:.1f} ms step) late at the "
            f"step's synchronization in {self.latest_steps} of {self.steps} steps{because}{cost}"
        )


def check_stragglers(ranks: list[RankSteps], host_loads: list[HostLoad] | None = None) -> StragglerCheck | None:
    """The straggler verdict over the steps every rank reported; None with fewer than two ranks."""
    ranks = _aligned(ranks)
    if len(ranks) < 2 or not ranks[0].steps:
        return None
    n = len(ranks[0].steps)
    measured = all(r.wait_ms is not None and all(w is not None for w in r.wait_ms) for r in ranks)
    arrival = [_arrival(r, measured) for r in ranks]  # larger = later
    step = median(v for r in ranks for v in _cycle_ms(r))
    late_per_rank = [[mine[s] - min(a[s] for a in arrival) for s in range(n)] for mine in arrival]
    paces = [_pace(r, late) for r, late in zip(ranks, late_per_rank)]
    best = max(range(len(ranks)), key=lambda i: median(late_per_rank[i]))
    margin = [arrival[best][s] - max(a[s] for i, a in enumerate(arrival) if i != best) for s in range(n)]
    late = median(margin)
    latest = sum(1 for d in margin if d > 0)
    p = _signed_rank_p(margin)
    threshold = max(MIN_SHARE * step, MIN_MS)
    excess = _excess(paces, best)
    others = [p_.wait_ms for i, p_ in enumerate(paces) if i != best and p_.wait_ms is not None]
    check = StragglerCheck(
        straggler=None,
        cause=None,
        late_ms=late,
        step_ms=step,
        steps=n,
        latest_steps=latest,
        p_value=p,
        threshold_ms=threshold,
        excess_ms=excess,
        others_wait_ms=median(others) if others else None,
        comm_ms=paces[best].wait_ms,
        wait_measured=measured,
        ranks=paces,
        candidate=ranks[best].rank,
    )
    if not measured:
        check.reasons.append(
            "the synchronization wait was not measured, so lateness is read from data, forward and "
            "optimizer time only: a rank slow in backward is not seen"
        )
    if _consistent(check, margin, len(ranks)):
        _blame(check, paces, best, [h for h in host_loads or [] if h.host == ranks[best].host or not h.host])
    return check


def _consistent(check: StragglerCheck, margin: list[float], world: int) -> bool:
    """Whether the latest rank's margin is large, significant and steady enough to name it (reasons said)."""
    n, late, reasons = check.steps, check.late_ms, check.reasons
    if n < MIN_STEPS:
        reasons.append(f"only {n} steps seen by every rank (at least {MIN_STEPS} are needed)")
        return False
    blocks = _block_medians(margin)
    blocks_ok = all(b > 0 for b in blocks)
    reasons.append(
        f"rank {check.candidate} is latest by a median {late:.2f} ms (threshold {check.threshold_ms:.2f} ms: "
        f"{MIN_SHARE:.0%} of the step, at least {MIN_MS} ms)"
    )
    reasons.append(
        f"latest in {check.latest_steps} of {n} steps (signed-rank test p={check.p_value:.2g}, "
        f"needs < {ALPHA / world:.2g})"
    )
    reasons.append(f"window thirds {'agree' if blocks_ok else 'disagree'} ({', '.join(f'{b:.2f}' for b in blocks)} ms)")
    return late >= check.threshold_ms and check.p_value < ALPHA / world and blocks_ok


def _blame(check: StragglerCheck, paces: list[RankPace], best: int, loads: list[HostLoad]) -> None:
    """Name the latest rank with its cause — unless its host was busy and the neighbours could be why."""
    late = check.late_ms
    check.cause = _cause(check.excess_ms, late)
    check.cpu_wait_excess_ms = _thread_excess(paces, best, "cpu_wait_ms")
    on_core = _thread_excess(paces, best, "cpu_ms")
    if on_core is not None and check.cpu_wait_excess_ms is not None:
        check.off_core_ms = late - max(0.0, on_core) - max(0.0, check.cpu_wait_excess_ms)
    starved = check.cpu_wait_excess_ms is not None and check.cpu_wait_excess_ms >= 0.5 * late
    computing = on_core is not None and on_core >= 0.5 * late
    busy = next((h for h in loads if h.contended), None)
    if busy is not None and not _own_doing(check, late):
        # Work on a core that others share runs slower even when it never waits in the run queue (a
        # busy hyperthread sibling, memory bandwidth): on a busy host, only a rank late while it was
        # off its core (asleep, or waiting for a disk or its data) is told apart from its neighbours'.
        check.contention = busy
        check.reasons.append(
            f"the host was busy: other processes kept {busy.other_cores:.1f} of its {busy.cores} cores busy while "
            f"the ranks used {busy.ranks_cores:.1f}, and rank {check.candidate} was late in "
            f"{PHASE_WORDS[check.cause]}, which that contention can cause: no rank is blamed"
        )
        return
    if computing and late < COMPUTE_SHARE * check.step_ms:
        check.reasons.append(
            f"rank {check.candidate} spent its lateness computing on its core, and {late:.2f} ms is under "
            f"{COMPUTE_SHARE:.0%} of the step: identical ranks' compute differs that much on CPU cores"
        )
        return
    if starved:
        check.cause = "cpu"  # its own threads (loader workers, intra-op threads) outnumber its cores
    check.straggler = check.candidate


def _own_doing(check: StragglerCheck, late: float) -> bool:
    """Whether the rank's lateness is its own even on a busy host: mostly spent off its core, or
    (where the thread's times were not read) in waiting for its data."""
    if check.off_core_ms is not None:
        return check.off_core_ms >= 0.5 * late
    return check.cause == "data"


def _thread_excess(paces: list[RankPace], index: int, field: str) -> float | None:
    """The latest rank's median of a per-thread figure minus the other ranks' median."""
    mine = getattr(paces[index], field)
    theirs = [getattr(p, field) for i, p in enumerate(paces) if i != index and getattr(p, field) is not None]
    return None if mine is None or not theirs else mine - median(theirs)


def _aligned(ranks: list[RankSteps]) -> list[RankSteps]:
    """The ranks restricted to the step numbers all of them reported (same order)."""
    if not ranks:
        return []
    common = set(ranks[0].steps)
    for r in ranks[1:]:
        common &= set(r.steps)
    out = []
    for r in sorted(ranks, key=lambda r: r.rank):
        keep = [i for i, s in enumerate(r.steps) if s in common]

        def pick(values: list[Any] | None, keep: list[int] = keep) -> list[Any] | None:
            return None if values is None else [values[i] for i in keep]

        out.append(
            RankSteps(
                r.rank,
                [r.steps[i] for i in keep],
                [r.step_ms[i] for i in keep],
                {k: pick(v) or [] for k, v in r.phases.items()},
                pick(r.wait_ms),
                None if r.phase_wait_ms is None else {k: pick(v) or [] for k, v in r.phase_wait_ms.items()},
                r.host,
                pick(r.cpu_ms),
                pick(r.cpu_wait_ms),
            )
        )
    return out


def _arrival(r: RankSteps, measured: bool) -> list[float]:
    """How late the rank comes to the step's synchronizations, up to a constant shared by all ranks."""
    if measured:
        assert r.wait_ms is not None
        return [-(w or 0.0) for w in r.wait_ms]  # who waits least arrived last
    own = [sum(_value(r.phases, p, s) for p in ("data", "forward", "optimizer")) for s in range(len(r.steps))]
    return own


def _phase_waits(r: RankSteps) -> dict[str, list[float | None]]:
    """Per phase, its per-step waiting (all waiting inside backward where no split was recorded)."""
    if r.phase_wait_ms is not None:
        return r.phase_wait_ms
    return {"backward": list(r.wait_ms)} if r.wait_ms is not None else {}


def _cycle_ms(r: RankSteps) -> list[float]:
    """Each step's time plus any wait the step's clock did not see (a collective after it stopped):
    how often the ranks really step."""
    if r.wait_ms is None:
        return list(r.step_ms)
    inside = [sum(_value(_phase_waits(r), phase, s) for phase in PHASES) for s in range(len(r.steps))]
    return [t + max(0.0, (w or 0.0) - i) for t, w, i in zip(r.step_ms, r.wait_ms, inside)]


def _value(phases: dict[str, list[float | None]], name: str, index: int) -> float:
    values = phases.get(name) or []
    value = values[index] if index < len(values) else None
    return float(value) if value is not None else 0.0


def _pace(r: RankSteps, late: list[float]) -> RankPace:
    def med(values: list[float | None] | None) -> float | None:
        kept = [v for v in values or [] if v is not None]
        return median(kept) if kept else None

    n = len(r.steps)
    waits = _phase_waits(r)
    own: dict[str, list[float | None]] = {}  # each phase without the waiting inside it
    for phase in PHASES:
        values = r.phases.get(phase) or [None] * n
        own[phase] = [None if v is None else max(0.0, v - _value(waits, phase, s)) for s, v in enumerate(values)]
    other: list[float | None] = []
    for s in range(n):
        known = [(r.phases.get(p) or [None] * n)[s] for p in PHASES]
        other.append(max(0.0, r.step_ms[s] - sum(v for v in known if v is not None)))
    return RankPace(
        r.rank,
        median(_cycle_ms(r)),
        med(own["data"]),
        med(own["forward"]),
        med(own["backward"]),
        med(own["optimizer"]),
        med(other),
        med(r.wait_ms),
        median(late),
        med(r.cpu_ms),
        med(r.cpu_wait_ms),
    )


def _excess(paces: list[RankPace], index: int) -> dict[str, float]:
    """Per phase: the latest rank's median minus the median of the other ranks' medians."""
    me = paces[index]
    out = {}
    for phase in (*PHASES, "other"):
        mine = getattr(me, f"{phase}_ms")
        theirs = [getattr(p, f"{phase}_ms") for i, p in enumerate(paces) if i != index]
        theirs = [t for t in theirs if t is not None]
        if mine is not None and theirs:
            out[phase] = mine - median(theirs)
    return out


def _cause(excess: dict[str, float], late: float) -> str:
    """The phase whose excess explains at least half the lateness; else 'unexplained'."""
    if not excess:
        return "unexplained"
    phase, extra = max(excess.items(), key=lambda item: item[1])
    return phase if extra >= 0.5 * late else "unexplained"


def _cause_words(check: StragglerCheck) -> str:
    if check.cause == "unexplained":
        return (
            ", for a reason outside its measured phases (time between steps: the loop's own code, "
            "logging, host scheduling)"
        )
    cause = check.cause or ""
    if cause == "cpu":
        return (
            f" because its training thread waits {check.cpu_wait_excess_ms:.1f} ms a step longer than the "
            "others' for a CPU core (its own threads or loader workers outnumber its cores)"
        )
    me = next(p for p in check.ranks if p.rank == check.straggler)
    others = [getattr(p, f"{cause}_ms") for p in check.ranks if p.rank != check.straggler]
    others = [o for o in others if o is not None]
    theirs = f" against {median(others):.1f} ms on the other ranks" if others else ""
    return f" because its {PHASE_WORDS[cause]} takes {getattr(me, f'{cause}_ms'):.1f} ms a step{theirs}"


def _signed_rank_p(margins: list[float]) -> float:
    """One-sided Wilcoxon signed-rank p-value that the margins lean positive: a rank later than the
    others more often and by more than chance allows. Under no fault, ranks are exchangeable and a
    margin is as likely negative as positive."""
    from scipy.stats import wilcoxon

    if not any(margins):
        return 1.0
    return float(wilcoxon(margins, alternative="greater", zero_method="zsplit").pvalue)


def _block_medians(values: list[float]) -> list[float]:
    size = max(1, len(values) // BLOCKS)
    blocks = [values[i * size : (i + 1) * size] for i in range(BLOCKS - 1)]
    blocks.append(values[(BLOCKS - 1) * size :])
    return [median(b) for b in blocks if b]
