"""Watched runs in the run history: a user's own job, written while it runs, read back with its state.

The writer (`workbench.watch`) calls `start_watch_run` once, then `flush_watch_run` now and
then with its running figures, each one transaction; `watched_runs`/`watched_run` read them.
A job that raises, or is stopped by a signal, writes its end as 'failed' with how (the
exception and its line, or the signal) in its message and summary. A process killed outright
never writes its end: a run still 'running' whose heartbeat is older than `STALE_AFTER_S` and
whose process is gone (or, on another host, whose heartbeat is older than `OTHER_HOST_STALE_S`)
reads as 'killed' with its last stored step, its message saying when it stopped reporting.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from workbench.store import records
from workbench.store.core import HistoryRow, Store

#: A running job's writer beats about once a second; this much silence with its pid gone means killed.
STALE_AFTER_S = 10.0
#: Another host's pid cannot be checked: only a much longer silence reads as killed there.
OTHER_HOST_STALE_S = 600.0
STEP_FIELDS = (
    "wall_time",
    "step_ms",
    "data_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "peak_memory_bytes",
    "loss",
    "forward_wait_ms",
    "backward_wait_ms",
    "cpu_ms",
    "cpu_wait_ms",
)


#: Columns of a step row beyond `STEP_FIELDS`' numbers: stage name -> ms, stored as JSON.
STAGES = "stages"
_COLUMNS = (*STEP_FIELDS, STAGES)


def compile_line(compiled: dict[str, Any] | None) -> str:
    """A watched run's compile counts and first break site in one line ('' when it compiled nothing)."""
    if not compiled:
        return ""
    first = compiled["break_sites"][0] if compiled.get("break_sites") else None
    where = f"; first break at {first['where']} ({first['reason_class']})" if first else ""
    return (
        f"compile: {compiled['graphs']} graph(s), {compiled['graph_breaks']} graph break(s), "
        f"{compiled['recompiles']} recompile(s){where}"
    )


@dataclass(frozen=True)
class StepRow:
    """One stored step row: `steps` consecutive steps from `first_step`, their means (peak: max)."""

    first_step: int
    steps: int
    wall_time: float
    step_ms: float | None = None
    data_ms: float | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    peak_memory_bytes: int | None = None
    loss: float | None = None
    forward_wait_ms: float | None = None
    """Waiting at the forward's entry (inside `forward_ms`): DDP's buffer broadcast, FSDP2's all-gather."""
    backward_wait_ms: float | None = None
    """Waiting at the gradient synchronization (inside `backward_ms`): from the last gradient to backward's end."""
    cpu_ms: float | None = None
    """The training thread's time on a core."""
    cpu_wait_ms: float | None = None
    """The training thread's time runnable without a core (the kernel's run queue)."""
    stages: dict[str, float] | None = None
    """Milliseconds per stage the job's Dataset marked (`wb.stage`) in the batches the step used;
    None where nothing was marked (not measured, never 0)."""


@dataclass(frozen=True)
class WatchedRun:
    """A watched run as read now; `status` is 'running', 'ended', 'failed' or 'killed' (decided on read)."""

    run_id: int
    name: str
    status: str
    message: str
    host: str | None
    pid: int | None
    started_at: float
    heartbeat_at: float
    ended_at: float | None
    last_step: int
    warmup: int
    device_name: str | None
    commit: str | None
    dirty: bool
    env_key: str
    environment: dict[str, Any]
    config: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    world_size: int | None = None
    job: str | None = None
    """What every rank of one multi-process launch shares (None for a single-process job)."""

    @property
    def nonfinite_loss(self) -> str:
        """'non-finite loss from step 7' when the loss went NaN or infinite (the first such step), else ''."""
        step = self.summary.get("first_nonfinite_loss_step")
        return f"non-finite loss from step {step}" if step is not None else ""

    @property
    def compiled(self) -> str:
        """'compile: 2 graph(s), 1 graph break(s), 2 recompile(s); first break at model.py:42 (explicit)'
        for a job that compiled (`workbench.watch.compiled`), else ''."""
        return compile_line(self.summary.get("compile"))

    def history_row(self) -> HistoryRow:
        """This run as a line of `workbench history` (kind 'watch'; trial id 'watch-<run id>')."""
        notes = (self.nonfinite_loss, self.compiled, self.message)
        message = "; ".join(m for m in notes if m) or f"last step {self.last_step}"
        label = self.name if self.rank is None else f"{self.name} rank {self.rank}/{self.world_size}"
        return HistoryRow(
            id=self.run_id, run_id=self.run_id, kind="watch", label=label, trial_id=f"watch-{self.run_id}",
            started_at=self.started_at, saved_at=self.heartbeat_at, workload=self.name, preset=None,
            config=self.config, commit=self.commit, dirty=self.dirty, device_name=self.device_name, host=self.host,
            status=self.status, message=message, median_step_ms=self.summary.get("steady_median_ms"),
            iqr_step_ms=self.summary.get("steady_iqr_ms"), steps=self.last_step, warmup=self.warmup,
        )  # fmt: skip


def start_watch_run(
    store: Store, name: str, *, config: dict[str, Any], environment: dict[str, Any], warmup: int, pid: int,
    rank: int | None = None, world_size: int | None = None, job: str | None = None,
) -> int:  # fmt: skip
    """Write the run row and its watch row (status 'running'); returns the run id."""
    commit, dirty = records.split_commit(environment.get("git_commit"))
    now = time.time()
    with store._write() as conn:
        run_id = store._insert_run(conn, "watch", name)
        conn.execute(
            "INSERT INTO watch_runs (run_id, name, status, host, pid, pid_started_at, started_at, heartbeat_at, "
            "warmup, device_name, git_commit, git_dirty, env_key, environment, config, rank, world_size, job) "
            "VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, name, platform.node(), pid, _process_started(pid), now, now, warmup,
             environment.get("device_name"), commit, int(dirty), records.env_key(environment),
             _dumps(environment), _dumps(config), rank, world_size, job),
        )  # fmt: skip
    return run_id


def flush_watch_run(
    store: Store,
    run_id: int,
    *,
    last_step: int,
    summary: dict[str, Any],
    history: Sequence[StepRow],
    replace_history: bool,
    recent: Sequence[StepRow],
    recent_from: int,
    ended: str | None = None,
    failed: bool = False,
) -> None:
    """One transaction: new (or, after a downsampling, all) history rows, the recent rows, the heartbeat.

    Recent rows before `recent_from` are deleted: the store holds the recent window in
    full and the whole run downsampled, both bounded. `ended` (a message, '' for a clean
    end) marks the run ended, or failed when `failed`.
    """
    now = time.time()
    with store._write() as conn:
        if replace_history:
            conn.execute("DELETE FROM watch_steps WHERE run_id = ? AND recent = 0", (run_id,))
        _upsert(conn, run_id, 0, history)
        _upsert(conn, run_id, 1, recent)
        conn.execute(
            "DELETE FROM watch_steps WHERE run_id = ? AND recent = 1 AND first_step < ?", (run_id, recent_from)
        )
        if ended is None:
            conn.execute(
                "UPDATE watch_runs SET heartbeat_at = ?, last_step = ?, summary = ? WHERE run_id = ?",
                (now, last_step, _dumps(summary), run_id),
            )
        else:
            conn.execute(
                "UPDATE watch_runs SET heartbeat_at = ?, last_step = ?, summary = ?, status = ?, message = ?, "
                "ended_at = ? WHERE run_id = ?",
                (now, last_step, _dumps(summary), "failed" if failed else "ended", ended, now, run_id),
            )


def watched_runs(
    store: Store, *, name: str | None = None, commit: str | None = None, since: float | None = None,
    before_run: int | None = None, job: str | None = None, limit: int | None = 50, now: float | None = None,
) -> list[WatchedRun]:  # fmt: skip
    """Watched runs newest first, each with its state decided at `now` (default: now); filters combine with AND."""
    clauses, params = ["1 = 1"], []
    for clause, value in (("name = ?", name), ("git_commit LIKE ? || '%'", commit), ("started_at >= ?", since),
                          ("run_id < ?", before_run), ("job = ?", job)):  # fmt: skip
        if value is not None:
            clauses.append(clause)
            params.append(value)
    sql = f"SELECT * FROM watch_runs WHERE {' AND '.join(clauses)} ORDER BY run_id DESC"
    if limit is not None:
        sql, params = sql + " LIMIT ?", [*params, int(limit)]
    with store._read() as conn:
        rows = conn.execute(sql, params).fetchall()
    return [_watched(row, now) for row in rows]


def watched_run(store: Store, run_id: int, *, now: float | None = None) -> WatchedRun:
    """One watched run by its run id; KeyError naming the store when absent."""
    with store._read() as conn:
        row = conn.execute("SELECT * FROM watch_runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        raise KeyError(f"no watched run {run_id} in {store.path} (`workbench history` lists them, kind 'watch')")
    return _watched(row, now)


def watch_steps(store: Store, run_id: int, *, recent: bool = False) -> list[StepRow]:
    """A watched run's stored rows in step order: the downsampled whole run, or the recent window."""
    with store._read() as conn:
        rows = conn.execute(
            f"SELECT first_step, steps, {', '.join(_COLUMNS)} FROM watch_steps WHERE run_id = ? AND recent = ? "
            "ORDER BY first_step",
            (run_id, int(recent)),
        ).fetchall()
    return [_step_row(dict(row)) for row in rows]


def last_steps(store: Store, run_ids: Sequence[int]) -> dict[int, StepRow]:
    """Each run's newest recent row (one query), for a list of watched jobs showing where each is now."""
    if not run_ids:
        return {}
    marks = ", ".join("?" for _ in run_ids)
    with store._read() as conn:
        rows = conn.execute(
            f"SELECT run_id, first_step, steps, {', '.join(_COLUMNS)} FROM watch_steps AS s WHERE recent = 1 "
            f"AND run_id IN ({marks}) AND first_step = (SELECT MAX(first_step) FROM watch_steps "
            "WHERE run_id = s.run_id AND recent = 1)",
            list(run_ids),
        ).fetchall()
    # sqlite3.Row iterates its values, not its keys: .keys() is needed
    return {row["run_id"]: _step_row({k: row[k] for k in row.keys() if k != "run_id"}) for row in rows}  # noqa: SIM118


def decide_status(status: str, host: str | None, pid: int | None, pid_started_at: float | None,
                  heartbeat_at: float, now: float | None = None) -> str:  # fmt: skip
    """'killed' for a 'running' row whose writer is silent and whose process is gone; else as stored."""
    if status != "running":
        return status
    silent = (now if now is not None else time.time()) - heartbeat_at
    if host != platform.node():
        return "killed" if silent > OTHER_HOST_STALE_S else status
    if silent > STALE_AFTER_S and not _alive(pid, pid_started_at):
        return "killed"
    return status


# --- internals ----------------------------------------------------------------------


def _upsert(conn: Any, run_id: int, recent: int, rows: Sequence[StepRow]) -> None:
    if not rows:
        return
    names = ("first_step", "steps", *_COLUMNS)
    updates = ", ".join(f"{n} = excluded.{n}" for n in names[1:])
    conn.executemany(
        f"INSERT INTO watch_steps (run_id, recent, {', '.join(names)}) VALUES (?, ?, {', '.join('?' for _ in names)}) "
        f"ON CONFLICT (run_id, recent, first_step) DO UPDATE SET {updates}",
        [(run_id, recent, *(getattr(r, n) for n in names[:-1]), _stages_json(r.stages)) for r in rows],
    )


def _stages_json(stages: dict[str, float] | None) -> str | None:
    return json.dumps(stages, sort_keys=True) if stages else None


def _step_row(values: dict[str, Any]) -> StepRow:
    """A stored row's columns as a `StepRow` (the stages read back from their JSON)."""
    stages = values.pop(STAGES, None)
    return StepRow(**values, stages=json.loads(stages) if stages else None)


def _watched(row: Any, now: float | None) -> WatchedRun:
    status = decide_status(row["status"], row["host"], row["pid"], row["pid_started_at"], row["heartbeat_at"], now)
    message = row["message"]
    if status == "killed" and not message:  # nothing was written at its end: say what is known instead
        why = "its process is gone" if row["host"] == platform.node() else "its host has said nothing since"
        message = f"stopped reporting after step {row['last_step']} at {_clock(row['heartbeat_at'])}; {why}"
    return WatchedRun(
        run_id=row["run_id"], name=row["name"], status=status, message=message, host=row["host"], pid=row["pid"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"], ended_at=row["ended_at"], last_step=row["last_step"], warmup=row["warmup"],
        device_name=row["device_name"], commit=row["git_commit"], dirty=bool(row["git_dirty"]), env_key=row["env_key"],
        environment=json.loads(row["environment"]), config=json.loads(row["config"]),
        summary=json.loads(row["summary"] or "{}"), rank=row["rank"], world_size=row["world_size"], job=row["job"],
    )  # fmt: skip


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _process_started(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def _alive(pid: int | None, started_at: float | None) -> bool:
    """The writing process still runs (the same one: a reused pid has another start time)."""
    if pid is None:
        return False
    now_started = _process_started(pid)
    if now_started is None:
        return False
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except (psutil.Error, OSError):
        return False
    return started_at is None or abs(now_started - started_at) < 1.0


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True, default=str)
