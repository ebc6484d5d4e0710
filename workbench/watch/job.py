"""A multi-process watched job read as one: its state, each rank's steady figures, the rank skew and the straggler.

The job has failed when any rank failed (raised, or was stopped by a signal) or was killed; the
rank named is the first to fail by the distributed trial's rule (`workbench.distributed.failures`):
a rank that only echoes another's death (a gloo "connection closed by peer", torchrun's SIGTERM to
the survivors) is never the root cause while a rank failed in a way of its own, and a rank killed
outright, which cannot say when, comes after those that could.

In a data-parallel step the ranks meet in backward (DDP's all-reduce, FSDP's reduce-scatter):
a rank still waiting for its batch or running its forward when the others arrive makes them all
wait there, so every rank's step time is about the same and the one that differs is the time
*before* the collective: data wait + forward. The rank with the longest such time is the
straggler, named when the spread reaches `STRAGGLER_SKEW` of a step (the same threshold a
distributed trial's straggler finding uses); its data wait says whether its loader is why.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.ranks import STRAGGLER_SKEW
from workbench.distributed.failures import RankFailure, consequence_of, explain_failures
from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.store.watched import WatchedRun, watched_runs
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
    """(slowest - fastest) time before the collective, over the median step time."""
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
            "ranks": [{**vars(r), "before_collective_ms": r.before_collective_ms} for r in self.ranks],
        }

    def describe(self) -> str:
        """A few lines: the job's state (which rank failed first, and how), the straggler (or that the
        ranks keep pace), then one line per rank."""
        watched = f"{len(self.ranks)} of {self.world_size or '?'} rank(s) watched"
        lines = [f"{self.name}: {self.status}, {watched} ({self.job})"]
        lines += (self.failure or "").splitlines()
        if self.straggler is not None:
            slow = next(r for r in self.ranks if r.rank == self.straggler)
            lines.append(f"straggler: rank {slow.rank}, {self.skew:.0%} of a step later to the collective than the "
                         f"fastest rank; its data wait is {ms(slow.data_ms)} a step")  # fmt: skip
        lines += self.notes
        for r in self.ranks:
            nonfinite = r.first_nonfinite_loss_step
            loss = f", non-finite loss from step {nonfinite}" if nonfinite is not None else ""
            lines.append(f"  rank {r.rank}: step {ms(r.step_ms)}, data wait {ms(r.data_ms)}, forward "
                         f"{ms(r.forward_ms)}, last step {r.last_step} ({r.status}){loss}")  # fmt: skip
        return "\n".join(lines)

    def _failures(self) -> list[RankFailure]:
        failures = [RankFailure.from_dict({**r.failure, "rank": r.rank}) for r in self.ranks if r.failure is not None]
        for f in failures:  # a gloo/NCCL error that only echoes another rank's death is not a cause of its own
            f.consequence = consequence_of(f.exception or "") if f.how == "exception" else None
        return failures


def watched_job(job_or_name: str, store: StoreArg = DEFAULT_STORE) -> WatchedJob:
    """The newest job whose id or watch name is `job_or_name`, its ranks joined; KeyError when none."""
    with opened_store(store, create=False) as db:
        if db is None:
            raise KeyError("no run history to read (WORKBENCH_STORE=off); pass store= the file the job wrote")
        runs = watched_runs(db, job=job_or_name, limit=None)
        if not runs:
            named = [r for r in watched_runs(db, name=job_or_name, limit=None) if r.job]
            if not named:
                raise KeyError(f"no multi-process watched job '{job_or_name}' in {db.path}; a job's ranks are "
                               "joined when it runs under torchrun (`workbench history` lists watched runs)")  # fmt: skip
            runs = watched_runs(db, job=named[0].job, limit=None)
    return job_of(runs)


def job_of(runs: list[WatchedRun]) -> WatchedJob:
    """The job the given watched runs (all of one job) make up."""
    by_rank = {r.rank: r for r in sorted(runs, key=lambda r: r.run_id) if r.rank is not None}
    figures = [_figures(r) for _, r in sorted(by_rank.items())]
    first = runs[0]
    job = WatchedJob(str(first.job), first.name, first.world_size, figures)
    return _with_straggler(job)


def _figures(run: WatchedRun) -> RankFigures:
    s = run.summary
    return RankFigures(int(run.rank or 0), run.run_id, run.status, run.last_step, s.get("steady_median_ms"),
                       s.get("steady_data_ms"), s.get("steady_forward_ms"), run.message, _failure(run),
                       s.get("first_nonfinite_loss_step"))  # fmt: skip


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


def _with_straggler(job: WatchedJob) -> WatchedJob:
    timed = [r for r in job.ranks if r.before_collective_ms is not None]
    steps = [r.step_ms for r in job.ranks if r.step_ms is not None]
    if job.world_size and len(job.ranks) < job.world_size:
        job.notes.append(f"only {len(job.ranks)} of {job.world_size} ranks wrote a watched run so far")
    if len(timed) < 2 or not steps:
        job.notes.append("the ranks' pace is compared once two ranks have steady steps")
        return job
    slowest = max(timed, key=lambda r: r.before_collective_ms or 0.0)
    fastest = min(timed, key=lambda r: r.before_collective_ms or 0.0)
    skew = ((slowest.before_collective_ms or 0.0) - (fastest.before_collective_ms or 0.0)) / statistics.median(steps)
    straggler = slowest.rank if skew >= STRAGGLER_SKEW else None
    return WatchedJob(job.job, job.name, job.world_size, job.ranks, straggler, skew, job.notes)


def ms(value: float | None) -> str:
    return "-" if value is None else f"{format_ms(value)} ms"
