"""The run-history schema and its migrations, one list in version order.

A migration is a list of SQL statements run in one transaction with the version bump
(SQLite DDL is transactional), so a store is always at exactly one version. Add a
migration by appending to `MIGRATIONS`; never edit a released one.

Layout: `runs` groups the trials of one invocation (a `workbench compare`, a regression
check, a notebook comparison); `trials` holds one finished trial per row, its scalars as
columns, its lists and maps as JSON columns; `capability_sets` keeps the capability
report once per distinct report (it is the same for every trial on a machine, and a few
KB each, which 10,000 copies would turn into most of the file).
"""

from __future__ import annotations

import re

#: 'WBNC' in the SQLite header (`PRAGMA application_id`): marks a file as a workbench run history.
APPLICATION_ID = 0x57424E43

_V1 = [
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,            -- run / compare / regress / import
        label TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL
    )
    """,
    """
    CREATE TABLE capability_sets (
        key TEXT PRIMARY KEY,
        json TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id),
        label TEXT NOT NULL DEFAULT '',
        saved_at REAL NOT NULL,
        trial_id TEXT NOT NULL UNIQUE,
        status TEXT NOT NULL,
        message TEXT NOT NULL DEFAULT '',
        workload TEXT NOT NULL,        -- the Workload's name ('tiny-net')
        preset TEXT,
        workload_spec TEXT NOT NULL,   -- what was asked for: a built-in name or 'package.module:attr'
        spec_preset TEXT,              -- the preset asked for (a user's workload may report none)
        config_key TEXT NOT NULL,      -- hash of the configuration's identity (records.config_key)
        env_key TEXT NOT NULL,         -- hash of the comparable environment (records.env_key)
        git_commit TEXT,               -- without '+dirty'; see git_dirty
        git_dirty INTEGER NOT NULL DEFAULT 0,
        host TEXT,
        device_name TEXT,
        warmup INTEGER NOT NULL,
        steps INTEGER NOT NULL,
        batch_size INTEGER,
        samples_per_step INTEGER,
        median_step_ms REAL,           -- summary of step_ms, written with it (rows are never updated)
        iqr_step_ms REAL,
        peak_memory_bytes INTEGER,
        memory_method TEXT,
        time_to_first_step_s REAL,
        compile_time_s REAL,
        started_at REAL NOT NULL,
        wall_time_s REAL,
        diverged_step INTEGER,
        trace_path TEXT,               -- profiler trace of this trial, when one was recorded
        capabilities_key TEXT REFERENCES capability_sets(key),
        config TEXT NOT NULL,
        environment TEXT NOT NULL,
        device TEXT NOT NULL,
        applied TEXT NOT NULL,
        step_ms TEXT NOT NULL,
        warmup_step_ms TEXT NOT NULL,
        phase_ms TEXT NOT NULL,
        losses TEXT NOT NULL,
        memory_breakdown TEXT,
        other TEXT NOT NULL DEFAULT '{}' -- TrialResult fields without a column (and ones added later)
    )
    """,
    # History pages: newest first, optionally for one workload.
    "CREATE INDEX trials_by_workload ON trials(workload, id)",
    "CREATE INDEX trials_by_workload_spec ON trials(workload_spec, id)",
    # Baselines and series: one configuration on one kind of machine, newest run first.
    "CREATE INDEX trials_by_config ON trials(config_key, env_key, run_id)",
    "CREATE INDEX trials_by_commit ON trials(git_commit)",
    "CREATE INDEX trials_by_time ON trials(started_at)",
    "CREATE INDEX trials_by_run ON trials(run_id)",
]

# Watched runs (`workbench.watch`): a user's own job, written while it runs. Its `runs` row
# (kind 'watch') is joined by one `watch_runs` row, updated at every flush (heartbeat, last
# step, running summary), and by `watch_steps` rows: the whole run downsampled into buckets
# of `steps` consecutive steps (recent = 0), and the latest steps one per row (recent = 1).
# 'killed' is never written: a process killed outright cannot write it; it is decided on
# read from a stale heartbeat and a pid that is gone (store/watched.py).
_V2 = [
    """
    CREATE TABLE watch_runs (
        run_id INTEGER PRIMARY KEY REFERENCES runs(id),
        name TEXT NOT NULL,
        status TEXT NOT NULL,          -- running / ended
        message TEXT NOT NULL DEFAULT '',
        host TEXT,
        pid INTEGER,
        pid_started_at REAL,           -- the process's start time, so a reused pid is not mistaken for it
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL,
        ended_at REAL,
        last_step INTEGER NOT NULL DEFAULT 0,
        warmup INTEGER NOT NULL,
        device_name TEXT,
        git_commit TEXT,
        git_dirty INTEGER NOT NULL DEFAULT 0,
        env_key TEXT NOT NULL,
        environment TEXT NOT NULL,
        config TEXT NOT NULL,          -- the job's own configuration, as the user passed it
        summary TEXT NOT NULL DEFAULT '{}'
    )
    """,
    """
    CREATE TABLE watch_steps (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        recent INTEGER NOT NULL,
        first_step INTEGER NOT NULL,
        steps INTEGER NOT NULL,
        wall_time REAL NOT NULL,
        step_ms REAL,
        data_ms REAL,
        forward_ms REAL,
        backward_ms REAL,
        optimizer_ms REAL,
        peak_memory_bytes INTEGER,
        loss REAL,
        PRIMARY KEY (run_id, recent, first_step)
    )
    """,
    "CREATE INDEX watch_runs_by_name ON watch_runs(name, run_id)",
]

# Watched jobs of several processes (torchrun): each rank writes its own watched run, marked
# with its rank, the world size and the job all ranks of one launch share, so a reader joins
# them into one job (rank skew, the straggler). NULL for a single-process job.
_V3 = [
    "ALTER TABLE watch_runs ADD COLUMN rank INTEGER",
    "ALTER TABLE watch_runs ADD COLUMN world_size INTEGER",
    "ALTER TABLE watch_runs ADD COLUMN job TEXT",
    "CREATE INDEX watch_runs_by_job ON watch_runs(job, rank)",
]

# Profiled windows of watched jobs, on demand (store/watch_profiles.py): a request row that the
# job's writer takes, then the window's diagnosis and profile figures (JSON) on the same row.
_V4 = [
    """
    CREATE TABLE watch_profiles (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id),
        steps INTEGER NOT NULL,
        status TEXT NOT NULL,          -- requested / started / done / failed
        requested_at REAL NOT NULL,
        first_step INTEGER,
        last_step INTEGER,
        message TEXT NOT NULL DEFAULT '',
        diagnosis TEXT,
        profile TEXT
    )
    """,
    "CREATE INDEX watch_profiles_by_run ON watch_profiles(run_id, status)",
]

# Each watched step's time waiting for the other ranks — at its forward's entry (DDP's buffer
# broadcast, FSDP2's all-gather) and at the gradient synchronization (its last gradient to the end
# of backward) — and its training thread's time on a core and waiting for one: which rank arrives
# last, and whether its neighbours or its own work made it late. NULL where not measured.
_V5 = [
    "ALTER TABLE watch_steps ADD COLUMN forward_wait_ms REAL",
    "ALTER TABLE watch_steps ADD COLUMN backward_wait_ms REAL",
    "ALTER TABLE watch_steps ADD COLUMN cpu_ms REAL",
    "ALTER TABLE watch_steps ADD COLUMN cpu_wait_ms REAL",
]

# Each watched step's data preparation split by the stages its Dataset marked (`wb.stage`): a JSON
# object of stage name -> milliseconds, measured where the batches were made (a loader worker or
# the loop itself). NULL where nothing was marked: not measured, never 0.
_V6 = [
    "ALTER TABLE watch_steps ADD COLUMN stages TEXT",
]

#: MIGRATIONS[i] takes a store from version i to version i + 1.
MIGRATIONS: list[list[str]] = [_V1, _V2, _V3, _V4, _V5, _V6]


def schema_version() -> int:
    """The version this code writes and reads: the number of migrations."""
    return len(MIGRATIONS)


#: PostgreSQL has no `application_id`/`user_version` header: this one-row table carries both.
POSTGRES_VERSION_TABLE = "workbench_store"

_POSTGRES_TYPES = (
    # SQLite's rowid alias becomes an identity column (ids in save order, as in SQLite).
    (re.compile(r"\bid INTEGER PRIMARY KEY\b"), "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    # SQLite's INTEGER holds 64 bits (peak memory in bytes); PostgreSQL's holds 32.
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    # SQLite's REAL is a double; PostgreSQL's is a float4 (it would round timestamps to minutes).
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
)


def postgres_statement(statement: str) -> str:
    """A migration statement as PostgreSQL runs it: the same tables, columns and indexes, with
    the column types that hold what SQLite's do."""
    for pattern, replacement in _POSTGRES_TYPES:
        statement = pattern.sub(replacement, statement)
    return statement
