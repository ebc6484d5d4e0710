"""Asking a running watched job for a profiled window from outside it (a notebook, a terminal), and
reading the windows back: the run history carries the request, the job's writer thread takes it."""

from __future__ import annotations

from workbench.store import DEFAULT_STORE, StoreArg, opened_store
from workbench.store.core import Store
from workbench.store.watch_profiles import WatchProfile, check_steps, request_profile, watch_profiles
from workbench.store.watched import WatchedRun, watched_run, watched_runs


def profile_job(job: str | int, steps: int = 5, store: StoreArg = DEFAULT_STORE) -> list[int]:
    """Ask the running watched job `job` (a watch name: its newest launch, every running rank of it;
    or a run id) to profile its next `steps` steps; returns the request ids. The job takes the
    request at its next flush (about a second); `watch_windows` reads the results."""
    check_steps(steps)
    with opened_store(store, create=False) as opened:
        db = _readable(opened)
        runs = [run for run in _runs(db, job) if run.status == "running"]
        if not runs:
            raise LookupError(f"no running watched job '{job}': a profiled window needs the job to be running "
                              "(`workbench history` lists watched runs and their state)")  # fmt: skip
        return [request_profile(db, run.run_id, steps) for run in runs]


def watch_windows(job: str | int, store: StoreArg = DEFAULT_STORE) -> list[WatchProfile]:
    """Every profiled window (and open request) of the newest launch of `job`, oldest first."""
    with opened_store(store, create=False) as opened:
        db = _readable(opened)
        return [window for run in _runs(db, job) for window in watch_profiles(db, run.run_id)]


def _readable(db: Store | None) -> Store:
    if db is None:
        raise LookupError("no run history to read (WORKBENCH_STORE=off); pass store= the file the job writes")
    return db


def _runs(db: Store, job: str | int) -> list[WatchedRun]:
    if isinstance(job, int) or str(job).isdigit():
        return [watched_run(db, int(job))]
    runs = watched_runs(db, name=str(job), limit=64)
    if not runs:
        raise LookupError(f"no watched job named '{job}' in {db.path} (`workbench history` lists them)")
    newest = runs[0]
    return [r for r in runs if r.job == newest.job] if newest.job else [newest]
