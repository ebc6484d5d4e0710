"""Profiled windows of watched jobs: requests (from the job itself or from outside it) and results.

A request is a row with status 'requested'; the job's writer thread takes it ('started'), the
job profiles its next steps, and the writer stores the diagnosis and the profile's figures
('done', or 'failed' with the reason). Anyone can request: the job polls, so nothing has to
reach into the job's process, and a job that has ended simply never takes the request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from workbench.store.core import Store

#: Most steps one on-demand window profiles: the profiler slows every step it records.
MAX_STEPS = 50


@dataclass(frozen=True)
class WatchProfile:
    id: int
    run_id: int
    steps: int
    status: str
    """'requested', 'started', 'done' or 'failed'."""
    requested_at: float
    first_step: int | None
    last_step: int | None
    message: str
    diagnosis: dict[str, Any] | None
    profile: dict[str, Any] | None


def request_profile(store: Store, run_id: int, steps: int) -> int:
    """Ask the job writing run `run_id` to profile its next `steps` steps; returns the request's id."""
    check_steps(steps)
    with store._write() as conn:
        return store._insert_id(
            conn,
            "INSERT INTO watch_profiles (run_id, steps, status, requested_at) VALUES (?, ?, 'requested', ?)",
            (run_id, steps, time.time()),
        )


def take_request(store: Store, run_id: int) -> tuple[int, int] | None:
    """The oldest open request for this run, marked started: (id, steps); None when there is none.

    The job asks this at every flush: a read first, so the usual answer (none) takes no write lock."""
    query = "SELECT id, steps FROM watch_profiles WHERE run_id = ? AND status = 'requested' ORDER BY id LIMIT 1"
    with store._read() as conn:
        if conn.execute(query, (run_id,)).fetchone() is None:
            return None
    with store._write() as conn:
        row = conn.execute(query, (run_id,)).fetchone()
        if row is None:
            return None
        conn.execute("UPDATE watch_profiles SET status = 'started' WHERE id = ?", (row["id"],))
        return int(row["id"]), int(row["steps"])


def save_profile(
    store: Store, run_id: int, request_id: int | None, *, steps: int, first_step: int, last_step: int,
    diagnosis: dict[str, Any] | None, profile: dict[str, Any] | None, message: str = "",
) -> int:  # fmt: skip
    """Store a finished window (the request's row, or a new one for `w.profile()`); returns its id."""
    status = "done" if diagnosis is not None else "failed"
    values = (status, first_step, last_step, message, _dumps(diagnosis), _dumps(profile))
    with store._write() as conn:
        if request_id is None:
            return store._insert_id(
                conn,
                "INSERT INTO watch_profiles (run_id, steps, status, requested_at, first_step, last_step, message, "
                "diagnosis, profile) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, steps, *values[:1], time.time(), *values[1:]),
            )
        conn.execute(
            "UPDATE watch_profiles SET status = ?, first_step = ?, last_step = ?, message = ?, diagnosis = ?, "
            "profile = ? WHERE id = ?",
            (*values, request_id),
        )
        return request_id


def watch_profiles(store: Store, run_id: int) -> list[WatchProfile]:
    """A watched run's profiled windows and open requests, oldest first."""
    with store._read() as conn:
        rows = conn.execute("SELECT * FROM watch_profiles WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
    return [_profile(row) for row in rows]


def _profile(row: Any) -> WatchProfile:
    return WatchProfile(row["id"], row["run_id"], row["steps"], row["status"], row["requested_at"], row["first_step"],
                        row["last_step"], row["message"], _loads(row["diagnosis"]), _loads(row["profile"]))  # fmt: skip


def newest_profiles(store: Store, run_ids: list[int]) -> dict[int, WatchProfile]:
    """Each run's newest window or request (one query): what a list of jobs shows, polled often."""
    if not run_ids:
        return {}
    marks = ", ".join("?" for _ in run_ids)
    with store._read() as conn:
        rows = conn.execute(
            f"SELECT * FROM watch_profiles WHERE id IN (SELECT MAX(id) FROM watch_profiles WHERE run_id IN ({marks}) "
            "GROUP BY run_id)",
            list(run_ids),
        ).fetchall()
    return {row["run_id"]: _profile(row) for row in rows}


def check_steps(steps: Any) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be a whole number from 1 to {MAX_STEPS} (the profiler slows each), got {steps!r}")
    return steps


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
