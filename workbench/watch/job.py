"""A multi-process watched job read as one: its state, each rank's steady figures and the straggler, with its cause.

The job has failed when any rank failed (raised, or was stopped by a signal) or was killed; the
rank named is the first to fail by the distributed trial's rule (`workbench.distributed.failures`):
a rank that only echoes another's death (a gloo "connection closed by peer", torchrun's SIGTERM to
the survivors) is never the root cause while a rank failed in a way of its own, and a rank killed
outright, which cannot say when, comes after those that could.

Each rank's watch sees, per step, its data wait, forward, backward and optimizer time and how long
it waited between its last gradient and its optimizer step — in a data-parallel job, waiting in
the gradient all-reduce for the other ranks. The rank that waits least arrived last; the phase in
which it spends longer than the others is why. The verdict is the one a distributed trial gets
(`workbench.analysis.stragglers`): named only when consistent across steps and beyond the noise,
and a busy host is reported instead of a rank its contention slowed.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.stragglers import (
    PHASE_WORDS,
    PHASES,
    HostLoad,
    RankPace,
    RankSteps,
    StragglerCheck,
    check_stragglers,
)
from workbench.distributed.failures import RankFailure, consequence_of, explain_failures
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.store.core import Store
from workbench.store.watched import StepRow, WatchedRun, compile_line, watch_steps, watched_runs
from workbench.textfmt import format_ms


@dataclass(frozen=True)
class RankFigures:
    rank: int
    run_id: int
    status: str
    last_step: int
    step_ms: float | None
    data_ms: float | None
    forward_ms: float | None
    message: str = ""
    failure: dict[str, Any] | None = None
    """How this rank failed or was killed (`RankFailure` fields), None while it runs or when it ended well."""
    first_nonfinite_loss_step: int | None = None
    compile: dict[str, Any] | None = None
    """What this rank compiled: graphs, graph breaks, recompiles (`watch.compiled`); None if nothing."""
    stages_ms: dict[str, float] = field(default_factory=dict)
    """Its batches' preparation per stage its Dataset marked (`wb.stage`), steady medians in ms per
    step; empty when nothing was marked (not measured)."""

    @property
    def before_collective_ms(self) -> float | None:
        """Data wait + forward: what a rank does before it meets the others in backward."""
        if self.data_ms is None and self.forward_ms is None:
            return None
        return (self.data_ms or 0.0) + (self.forward_ms or 0.0)


@dataclass(frozen=True)
class WatchedJob:
    """The ranks of one launch; `straggler` is None while they keep pace (or too little is known)."""

    job: str
    name: str
    world_size: int | None
    ranks: list[RankFigures]
    straggler: int | None = None
    skew: float | None = None
    """How late the latest rank comes to the step's synchronization, as a share of the step."""
    check: StragglerCheck | None = None
    """The straggler rule's verdict with its evidence (None until two ranks have steady steps)."""
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """'failed' when any rank failed or was killed, else 'running' while any rank runs, else 'ended'."""
        if any(r.failure is not None for r in self.ranks):
            return "failed"
        return "running" if any(r.status == "running" for r in self.ranks) else "ended"

    @property
    def first_failed(self) -> RankFailure | None:
        """The rank that failed first (the root cause, not its echoes), None when none failed."""
        failures = self._failures()
        return explain_failures(failures)[0] if failures else None

    @property
    def failure(self) -> str | None:
        """The failed job's story in the distributed trial's words: "rank 1 failed first: ...", then the others."""
        failures = self._failures()
        return explain_failures(failures)[1] if failures else None

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failed
        return {
            "job": self.job,
            "name": self.name,
            "world_size": self.world_size,
            "status": self.status,
            "first_failed_rank": first.rank if first is not None else None,
            "failure": self.failure,
            "straggler": self.straggler,
            "skew": self.skew,
            "notes": list(self.notes),
            "check": self.check.to_dict() if self.check else None,
            "ranks": [{**vars(r), "before_collective_ms": r.before_collective_ms} for r in self.ranks],
        }

    def pace(self) -> str:
        """One line: the straggler with its cause and cost, a busy host, or why no rank is named."""
        return _pace_line(self.check) or " ".join(self.notes)

    def describe(self) -> str:
        """A few lines: the job's state (which rank failed first, and how), the straggler with its cause (or
        why none is named), then one line per rank."""
        watched = f"{len(self.ranks)} of {self.world_size or '?'} rank(s) watched"
        lines = [f"{self.name}: {self.status}, {watched} ({self.job})"]
        lines += (self.failure or "").splitlines()
        if self.check is not None:
            lines.append(self.pace())
        lines += self.notes
        paces = {p.rank: p for p in self.check.ranks} if self.check is not None else {}
        for r in self.ranks:
            nonfinite = r.first_nonfinite_loss_step
            loss = f", non-finite loss from step {nonfinite}" if nonfinite is not None else ""
            lines.append(
                f"  rank {r.rank}: step {ms(r.step_ms)}, data wait {ms(r.data_ms)}, forward "
                f"{ms(r.forward_ms)}{_timeline(paces.get(r.rank))}, last step {r.last_step} ({r.status}){loss}"
            )
            if r.stages_ms:
                slowest = sorted(r.stages_ms.items(), key=lambda item: -item[1])
                stages = ", ".join(f"{name} {ms(value)}" for name, value in slowest)
                lines.append(f"    data stages per step: {stages}")
            if r.compile:
                lines.append(f"    {compile_line(r.compile)}")
        return "\n".join(lines)

    def _failures(self) -> list[RankFailure]:
        failures = [RankFailure.from_dict({**r.failure, "rank": r.rank}) for r in self.ranks if r.failure is not None]
        for f in failures:  # a gloo/NCCL error that only echoes another rank's death is not a cause of its own
            f.consequence = consequence_of(f.exception or "") if f.how == "exception" else None
        return failures


def _timeline(pace: RankPace | None) -> str:
    """The rest of a rank's step from the straggler rule's medians: backward compute, optimizer, waiting."""
    if pace is None:
        return ""
    return (
        f", backward {ms(pace.backward_ms)}, optimizer {ms(pace.optimizer_ms)}, waits {ms(pace.wait_ms)} at the "
        f"synchronization, arrives {ms(pace.late_ms)} after the first"
    )


def _pace_line(check: StragglerCheck | None) -> str:
    if check is None:
        return ""
    if check.straggler is not None:
        return f"straggler: rank {check.straggler} ({PHASE_WORDS[check.cause or 'unexplained']}) — {check.sentence()}"
    if check.contention is not None:
        load = check.contention
        return (
            f"host busy: other processes kept {load.other_cores:.1f} of {load.cores} cores busy; rank "
            f"{check.candidate} ran {check.late_ms:.1f} ms late, which that can cause: no rank is blamed"
        )
    return "straggler: none, the ranks keep pace — " + "; ".join(check.reasons)


def watched_job(job_or_name: str, store: StoreArg = DEFAULT_STORE) -> WatchedJob:
    """The newest job whose id or watch name is `job_or_name`, its ranks joined; KeyError when none."""
    with opened_store(store, create=False) as db:
        if db is None:
            raise KeyError("no run history to read (WORKBENCH_STORE=off); pass store= the file the job wrote")
        runs = watched_runs(db, job=job_or_name, limit=None)
        if not runs:
            named = [r for r in watched_runs(db, name=job_or_name, limit=None) if r.job]
            if not named:
                raise KeyError(
                    f"no multi-process watched job '{job_or_name}' in {db.path}; a job's ranks are "
                    "joined when it runs under torchrun (`workbench history` lists watched runs)"
                )
            runs = watched_runs(db, job=named[0].job, limit=None)
        steps = job_steps(db, runs)
    return job_of(runs, steps)


def job_of(runs: list[WatchedRun], steps: dict[int, list[StepRow]] | None = None) -> WatchedJob:
    """The job the given watched runs (all of one job) make up; `steps` (each run's recent rows, by run
    id) lets it name a straggler, read as a distributed trial's is (`analysis.stragglers`)."""
    by_rank = {r.rank: r for r in sorted(runs, key=lambda r: r.run_id) if r.rank is not None}
    figures = [_figures(r) for _, r in sorted(by_rank.items())]
    first = runs[0]
    job = WatchedJob(str(first.job), first.name, first.world_size, figures)
    if job.world_size and len(job.ranks) < job.world_size:
        job.notes.append(f"only {len(job.ranks)} of {job.world_size} ranks wrote a watched run so far")
    ranked = list(by_rank.values())
    check = check_stragglers([_rank_steps(r, (steps or {}).get(r.run_id, [])) for r in ranked], _host_loads(ranked))
    if check is None or check.steps == 0:
        job.notes.append("the ranks' pace is compared once two ranks have steady steps")
        return job
    return dataclasses.replace(job, straggler=check.straggler, skew=check.share, check=check)


def job_steps(db: Store, runs: list[WatchedRun]) -> dict[int, list[StepRow]]:
    """Each rank's recent steps in full (the window the straggler rule reads), by run id."""
    return {r.run_id: watch_steps(db, r.run_id, recent=True) for r in runs if r.rank is not None}


def _rank_steps(run: WatchedRun, rows: list[StepRow]) -> RankSteps:
    """A rank's steady single-step rows as the straggler rule reads them."""
    kept = [r for r in rows if r.steps == 1 and r.first_step > run.warmup and r.step_ms is not None]
    forward_waits = [r.forward_wait_ms for r in kept]
    backward_waits = [r.backward_wait_ms for r in kept]
    waits = [None if b is None else b + (f or 0.0) for f, b in zip(forward_waits, backward_waits)]
    return RankSteps(
        rank=int(run.rank or 0),
        steps=[r.first_step for r in kept],
        step_ms=[float(r.step_ms or 0.0) for r in kept],
        phases={p: [getattr(r, f"{p}_ms") for r in kept] for p in PHASES},
        wait_ms=waits if kept and all(w is not None for w in waits) else None,
        phase_wait_ms={"forward": forward_waits, "backward": backward_waits},
        host=run.host or "",
        cpu_ms=[r.cpu_ms for r in kept],
        cpu_wait_ms=[r.cpu_wait_ms for r in kept],
    )


def _host_loads(runs: list[WatchedRun]) -> list[HostLoad]:
    """Per host, its busy cores and the ranks' own, from each rank's writer (averaged over its run)."""
    hosts: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        cpu = run.summary.get("host_cpu")
        if cpu:
            hosts.setdefault(run.host or "", []).append(cpu)
    return [
        HostLoad(
            statistics.fmean(c["busy_cores"] for c in cpus),
            sum(c["own_cores"] for c in cpus),
            int(cpus[0]["cores"]),
            host,
        )
        for host, cpus in hosts.items()
    ]


def _figures(run: WatchedRun) -> RankFigures:
    s = run.summary
    return RankFigures(
        int(run.rank or 0),
        run.run_id,
        run.status,
        run.last_step,
        s.get("steady_median_ms"),
        s.get("steady_data_ms"),
        s.get("steady_forward_ms"),
        run.message,
        _failure(run),
        s.get("first_nonfinite_loss_step"),
        s.get("compile"),
        dict(s.get("steady_stages_ms") or {}),
    )


def _failure(run: WatchedRun) -> dict[str, Any] | None:
    """A failed or killed rank as `RankFailure` fields: what its writer stored at its end, or for a rank
    killed outright (nothing stored), that it stopped reporting, with no time of death to rank it by."""
    where = {"pid": run.pid, "host": run.host}
    if run.status == "failed":
        stored = run.summary.get("failure")
        if isinstance(stored, dict):
            return {**stored, **where}
        return {"how": "exception", "died_at": run.ended_at, "exception": run.message, **where}
    if run.status == "killed":
        return {"how": "hung", "died_at": None, "position": f"after step {run.last_step}", **where}
    return None


def ms(value: float | None) -> str:
    return "-" if value is None else f"{format_ms(value)} ms"
