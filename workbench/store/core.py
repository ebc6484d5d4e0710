"""`Store`: save finished trials and query the run history.

A trial is written once, when it has finished, in one transaction with its run row and
capability set: there is no "in progress" row that a killed worker, a killed CLI or an
interrupted kernel could leave half-written. A failed trial (error, oom, timeout,
cancelled, diverged) is stored with its status and message as a record of the failure;
only status 'ok' trials are ever used as baselines or plotted.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.config import TrainConfig
from workbench.measure.result import TrialResult
from workbench.store import records
from workbench.store.db import SqliteDatabase
from workbench.store.location import default_store_path, is_database_url
from workbench.store.postgres import PostgresDatabase
from workbench.store.records import StoredTrial

_SELECT_TRIALS = (
    f"SELECT {', '.join('t.' + c for c in records.TRIAL_COLUMNS)}, c.json AS capabilities "
    "FROM trials t LEFT JOIN capability_sets c ON c.key = t.capabilities_key"
)
#: Sorts after every string that starts with a given prefix (TEXT compares as UTF-8 bytes).
_AFTER_ANY_TEXT = "\U0010ffff"
#: A commit prefix as a range scan on the commit index; byte order, not the server's locale
#: (PostgreSQL reads BINARY as its "C" collation, `postgres.postgres_sql`).
_COMMIT_PREFIX = "git_commit COLLATE BINARY >= ? AND git_commit COLLATE BINARY < ?"
_HISTORY_COLUMNS = (
    "t.id, t.run_id, r.kind, t.label, t.trial_id, t.started_at, t.saved_at, t.workload, t.preset, t.config, "
    "t.git_commit, t.git_dirty, t.device_name, t.host, t.status, t.message, t.median_step_ms, t.iqr_step_ms, "
    "t.steps, t.warmup"
)


@dataclass(frozen=True)
class HistoryRow:
    """One line of `workbench history`: a stored trial's summary, without its per-step arrays."""

    id: int
    run_id: int
    kind: str
    label: str
    trial_id: str
    started_at: float
    saved_at: float
    workload: str
    preset: str | None
    config: dict[str, Any]
    commit: str | None
    dirty: bool
    device_name: str | None
    host: str | None
    status: str
    message: str
    median_step_ms: float | None
    iqr_step_ms: float | None
    steps: int
    warmup: int

    @property
    def config_label(self) -> str:
        if self.kind == "watch":  # a watched job's own settings: no TrainConfig defaults to leave out
            return ", ".join(f"{k}={v}" for k, v in self.config.items()) or "-"
        defaults = TrainConfig().to_dict()
        parts = [f"{k}={v}" for k, v in self.config.items() if k != "extra" and defaults.get(k, object()) != v]
        parts += [f"extra.{k}={v}" for k, v in (self.config.get("extra") or {}).items()]
        return ", ".join(parts) or "defaults"

    @property
    def commit_label(self) -> str:
        if not self.commit:
            return "-"
        return self.commit[:10] + ("+dirty" if self.dirty else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "config_label": self.config_label, "commit_label": self.commit_label}


class Store:
    """The run history in one SQLite file (default: `default_store_path()`), or in a PostgreSQL
    database when given a `postgresql://` URL (a team's shared history; see `postgres.py`).

    Safe to share between threads (one connection behind a lock) and between processes
    (SQLite: WAL, writers queue on its lock; PostgreSQL: the server's MVCC). `create=False`
    refuses a missing file instead of starting a new history, for read-only commands (a server's
    database must exist either way; an empty one gets the history's tables on first use).
    """

    path: Path | str
    """The file, or the server's URL without its password: what messages name."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = True) -> None:
        target = path if path is not None else default_store_path()
        if target is None:
            raise ValueError("the default store is disabled (WORKBENCH_STORE=off); pass a path")
        self._db: SqliteDatabase | PostgresDatabase
        if is_database_url(target):
            self._db = PostgresDatabase(str(target).strip(), create=create)
        else:
            self._db = SqliteDatabase(Path(target).expanduser(), create=create)
        self.path = self._db.path
        self._lock = threading.Lock()
        self._wrote = False

    @property
    def _conn(self) -> Any:
        """The open connection (sqlite3's, or psycopg's behind the same `?`-placeholder face)."""
        return self._db.conn

    @property
    def shared(self) -> bool:
        """On a database server (PostgreSQL) rather than in a local file."""
        return isinstance(self._db, PostgresDatabase)

    def close(self) -> None:
        with self._lock:
            self._db.close(self._wrote)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # --- writing ------------------------------------------------------------------

    def recorder(self, kind: str, label: str = "") -> RunRecorder:
        """Saves one invocation's trials as each finishes; the run row is written with the first."""
        return RunRecorder(self, kind, label)

    def save_run(
        self, results: Sequence[TrialResult], *, kind: str = "import", labels: Sequence[str] = (), label: str = ""
    ) -> int:
        """Store finished results as one run, all in one transaction; returns the run id."""
        if not results:
            raise ValueError("save_run needs at least one result")
        with self._write() as conn:
            run_id = self._insert_run(conn, kind, label)
            for index, result in enumerate(results):
                self._insert_trial(conn, run_id, labels[index] if index < len(labels) else "", result)
        return run_id

    def attach_trace(self, trial_id: str, trace_path: str) -> None:
        """Record where a trial's profiler trace was written (kept out of the timed trial itself)."""
        with self._write() as conn:
            cursor = conn.execute("UPDATE trials SET trace_path = ? WHERE trial_id = ?", (trace_path, trial_id))
            if cursor.rowcount != 1:
                raise KeyError(f"no stored trial {trial_id!r} in {self.path}")

    def attach_comparison(self, trial_id: str, figures: dict[str, Any]) -> None:
        """Record a finished comparison's figures on a trial saved while it ran (`TrialResult.comparison`)."""
        with self._write() as conn:
            row = conn.execute("SELECT other FROM trials WHERE trial_id = ?", (trial_id,)).fetchone()
            if row is None:
                raise KeyError(f"no stored trial {trial_id!r} in {self.path}")
            other = json.loads(row[0] or "{}")
            other["comparison"] = figures
            conn.execute(
                "UPDATE trials SET other = ? WHERE trial_id = ?",
                (json.dumps(other, allow_nan=True, default=str), trial_id),
            )

    # --- queries ------------------------------------------------------------------

    def history(
        self,
        *,
        workload: str | None = None,
        config: TrainConfig | dict[str, Any] | None = None,
        commit: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = 50,
    ) -> list[HistoryRow]:
        """Stored trials newest first (save order), as summaries; filters combine with AND."""
        where, params = _filters(workload=workload, config=config, commit=commit, since=since, until=until)
        sql = f"SELECT {_HISTORY_COLUMNS} FROM trials t JOIN runs r ON r.id = t.run_id {where} ORDER BY t.id DESC"
        if limit is not None:
            sql, params = sql + " LIMIT ?", [*params, int(limit)]
        with self._read() as conn:
            return [_history_row(row) for row in conn.execute(sql, params)]

    def trials(
        self,
        *,
        workload: str | None = None,
        preset: str | None = None,
        config: TrainConfig | dict[str, Any] | None = None,
        commit: str | None = None,
        since: float | None = None,
        until: float | None = None,
        environment: dict[str, Any] | str | None = None,
        run_id: int | None = None,
        ok_only: bool = False,
        limit: int | None = None,
    ) -> list[StoredTrial]:
        """Full stored trials, oldest first. `config` matches by identity (`records.config_key`);
        `environment` (a fingerprint or an env key) keeps only comparable hardware."""
        where, params = _filters(workload=workload, preset=preset, config=config, commit=commit, since=since,
                                 until=until, environment=environment, run_id=run_id, ok_only=ok_only)  # fmt: skip
        sql = f"{_SELECT_TRIALS} {where} ORDER BY t.id"
        if limit is not None:  # the newest `limit`, still returned oldest first
            sql = f"SELECT * FROM ({_SELECT_TRIALS} {where} ORDER BY t.id DESC LIMIT ?) AS newest ORDER BY id"
            params = [*params, int(limit)]
        with self._read() as conn:
            return [_stored(row) for row in conn.execute(sql, params)]

    def get(self, trial: int | str) -> StoredTrial:
        """One stored trial by row id (int) or trial id (str); KeyError when absent."""
        column = "t.id" if isinstance(trial, int) else "t.trial_id"
        with self._read() as conn:
            row = conn.execute(f"{_SELECT_TRIALS} WHERE {column} = ?", (trial,)).fetchone()
        if row is None:
            raise KeyError(f"no stored trial {trial!r} in {self.path}")
        return _stored(row)

    def latest_baseline(
        self,
        environment: dict[str, Any] | str | None,
        workload: str,
        config: TrainConfig | dict[str, Any],
        *,
        preset: str | None = None,
        warmup: int | None = None,
        steps: int | None = None,
        commit: str | None = None,
        run_id: int | None = None,
        before_run: int | None = None,
        ok_only: bool = True,
    ) -> list[StoredTrial]:
        """The 'ok' trials of `config` from the newest stored run comparable with `environment`.

        All of that run's repeats are returned (compare pools them). `environment` is a
        fingerprint or an env key (None: any hardware). `commit` (a sha or a prefix)
        restricts to runs at that commit, preferring a clean tree over '+dirty'; `run_id`
        to one run; `before_run` to runs saved before it. [] when none.
        """
        where, params = _filters(workload=workload, preset=preset, config=config, environment=environment,
                                 commit=commit, run_id=run_id, ok_only=ok_only, warmup=warmup, steps=steps)  # fmt: skip
        if before_run is not None:
            where, params = where + " AND t.run_id < ?", [*params, before_run]
        order = "t.git_dirty, t.run_id DESC" if commit else "t.run_id DESC"
        with self._read() as conn:
            found = conn.execute(f"SELECT t.run_id FROM trials t {where} ORDER BY {order} LIMIT 1", params).fetchone()
            if found is None:
                return []
            rows = conn.execute(f"{_SELECT_TRIALS} {where} AND t.run_id = ? ORDER BY t.id", [*params, found[0]])
            return [_stored(row) for row in rows]

    def commits(self, prefix: str) -> list[str]:
        """Distinct stored commits starting with `prefix` (a range scan on the commit index)."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT DISTINCT git_commit FROM trials WHERE {_COMMIT_PREFIX} LIMIT 20",
                (prefix, prefix + _AFTER_ANY_TEXT),
            )
            return [row[0] for row in rows]

    def run(self, run_id: int) -> dict[str, Any] | None:
        """The run row ({'id', 'kind', 'label', 'created_at'}), or None."""
        with self._read() as conn:
            row = conn.execute("SELECT id, kind, label, created_at FROM runs WHERE id = ?", (run_id,)).fetchone()
        return dict(row) if row is not None else None

    def runs(self, *, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Run rows ({'id', 'kind', 'label', 'created_at'}), newest first; `kind` keeps one kind."""
        sql, params = "SELECT id, kind, label, created_at FROM runs", []
        if kind is not None:
            sql, params = sql + " WHERE kind = ?", [kind]
        with self._read() as conn:
            rows = conn.execute(sql + " ORDER BY id DESC LIMIT ?", [*params, int(limit)])
            return [dict(row) for row in rows]

    def workloads(self) -> list[str]:
        with self._read() as conn:
            return [row[0] for row in conn.execute("SELECT DISTINCT workload FROM trials ORDER BY workload")]

    def count(self) -> int:
        with self._read() as conn:
            return int(conn.execute("SELECT count(*) FROM trials").fetchone()[0])

    # --- internals ----------------------------------------------------------------

    @contextmanager
    def _read(self) -> Iterator[Any]:
        with self._lock:
            try:
                yield self._conn
            except self._db.errors as exc:
                raise self._db.explain(exc) from None

    @contextmanager
    def _write(self) -> Iterator[Any]:
        with self._lock, self._db.transaction() as conn:
            self._wrote = True
            yield conn

    def _insert_id(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        """One INSERT inside `_write()`; the new row's id (on either database)."""
        return self._db.insert_id(conn, sql, params)

    def _insert_run(self, conn: Any, kind: str, label: str) -> int:
        sql = "INSERT INTO runs (kind, label, created_at) VALUES (?, ?, ?)"
        return self._insert_id(conn, sql, (kind, label, time.time()))

    def _insert_trial(self, conn: Any, run_id: int, label: str, result: TrialResult) -> int:
        blob = records.capabilities_blob(result.capabilities)
        if blob is not None:
            conn.execute("INSERT INTO capability_sets (key, json) VALUES (?, ?) ON CONFLICT (key) DO NOTHING", blob)
        row = records.trial_row(result, blob[0] if blob else None)
        row.update(run_id=run_id, label=label, saved_at=time.time())
        names = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        return self._insert_id(conn, f"INSERT INTO trials ({names}) VALUES ({marks})", list(row.values()))


class RunRecorder:
    """The trials of one invocation, saved one by one as they finish (see `Store.recorder`)."""

    def __init__(self, store: Store, kind: str, label: str = "") -> None:
        self.store, self.kind, self.label = store, kind, label
        self.run_id: int | None = None

    def save(self, result: TrialResult, label: str = "") -> int:
        """Write one finished trial (and, the first time, the run row) in one transaction; its row id."""
        with self.store._write() as conn:
            run_id = self.run_id if self.run_id is not None else self.store._insert_run(conn, self.kind, self.label)
            trial_row_id = self.store._insert_trial(conn, run_id, label, result)
        self.run_id = run_id  # only once committed: a rolled-back first save leaves no run behind
        return trial_row_id


def _filters(**given: Any) -> tuple[str, list[Any]]:
    """WHERE clause for the query keywords that are set."""
    clauses: list[str] = []
    params: list[Any] = []
    simple = {"run_id": "t.run_id", "warmup": "t.warmup", "steps": "t.steps"}
    for key, column in simple.items():
        if given.get(key) is not None:
            clauses.append(f"{column} = ?")
            params.append(given[key])
    # A workload is found by its name or by what was asked for (a suite names 'my_models:tiny',
    # the trial reports 'tiny-net'); likewise the preset.
    for key, columns in {
        "workload": ("t.workload", "t.workload_spec"),
        "preset": ("t.preset", "t.spec_preset"),
    }.items():
        if given.get(key) is not None:
            clauses.append(f"({columns[0]} = ? OR {columns[1]} = ?)")
            params += [given[key], given[key]]
    if given.get("commit") is not None:  # a prefix (or a full sha), as a range scan on the index
        clauses.append(_COMMIT_PREFIX.replace("git_commit", "t.git_commit"))
        params += [given["commit"], given["commit"] + _AFTER_ANY_TEXT]
    if given.get("config") is not None:
        clauses.append("t.config_key = ?")
        params.append(records.config_key(given["config"]))
    environment = given.get("environment")
    if environment is not None:
        clauses.append("t.env_key = ?")
        params.append(environment if isinstance(environment, str) else records.env_key(environment))
    if given.get("since") is not None:
        clauses.append("t.started_at >= ?")
        params.append(given["since"])
    if given.get("until") is not None:
        clauses.append("t.started_at < ?")
        params.append(given["until"])
    if given.get("ok_only"):
        clauses.append("t.status = 'ok'")
    return ("WHERE " + " AND ".join(clauses) if clauses else "WHERE 1 = 1"), params


def _stored(row: Any) -> StoredTrial:
    capabilities = json.loads(row["capabilities"]) if row["capabilities"] else None
    return records.stored_trial(row, capabilities)


def _history_row(row: Any) -> HistoryRow:
    return HistoryRow(
        id=row["id"], run_id=row["run_id"], kind=row["kind"], label=row["label"], trial_id=row["trial_id"],
        started_at=row["started_at"], saved_at=row["saved_at"], workload=row["workload"], preset=row["preset"],
        config=json.loads(row["config"]), commit=row["git_commit"], dirty=bool(row["git_dirty"]),
        device_name=row["device_name"], host=row["host"], status=row["status"], message=row["message"],
        median_step_ms=row["median_step_ms"], iqr_step_ms=row["iqr_step_ms"], steps=row["steps"], warmup=row["warmup"],
    )  # fmt: skip
