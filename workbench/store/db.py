"""The SQLite file under the run history: where it lives, how it is opened, checked and migrated.

SQLite because the history must work with no server (a laptop, a CI runner, a notebook)
and survive crashes. WAL mode lets a reader (the notebook's History view) and writers
(a CI job, a second kernel) work at once; every write is one `BEGIN IMMEDIATE`
transaction, so a process killed mid-write leaves the file as it was before. The file
is never reset: an unreadable or damaged file (SQLite's `quick_check`, run read-only on
every open), a foreign database or a newer schema is a `StoreError` naming the file and
the fix, raised before anything is written.
WAL needs a local filesystem (not NFS): keep the store on local disk.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.store import schema
from workbench.store.location import (  # noqa: F401  (imported from here by callers)
    DISABLED_VALUES,
    ENV_VAR,
    StoreError,
    default_store_path,
    user_data_dir,
)

#: How long a writer waits for another writer's transaction (a trial's rows take milliseconds).
BUSY_TIMEOUT_S = 30.0


def connect(path: Path, *, create: bool = True) -> sqlite3.Connection:
    """Open `path`, refuse anything that is not a workbench store we can read, migrate an older one."""
    if not path.exists():
        if not create:
            raise StoreError(f"no run history at {path} yet (runs are saved there by `workbench run/compare/regress`)")
        _make_folder(path)
    else:
        check_integrity(path)
    try:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves (Python's implicit transactions
        # would start deferred ones, which can fail to upgrade to a write lock under contention).
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise explain(exc, path) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        _check_and_migrate(conn, path)
        # Only now, on a file we accept: switching to WAL writes the file header.
        _use_wal(conn)
        # In WAL mode NORMAL keeps every commit atomic and survives a killed process;
        # only a power cut may lose the last commits (never corrupt the file).
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
    except StoreError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise explain(exc, path) from None
    return conn


@contextmanager
def write_transaction(conn: sqlite3.Connection, path: Path) -> Iterator[sqlite3.Connection]:
    """One atomic write: all statements inside land together or not at all (also on KeyboardInterrupt).

    BEGIN IMMEDIATE takes the write lock up front, so two writers queue (busy timeout)
    instead of one failing when it upgrades a read lock; a lock still held after the
    timeout is retried once more before giving up with a clear error.
    """
    _begin_immediate(conn, path)
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise explain(exc, path) from None
        raise


def check_integrity(path: Path) -> None:
    """Refuse a damaged file before anything can write to it: SQLite's `quick_check` over a
    read-only connection (30-60 ms on a 10,000-trial, 46 MiB store). A store that fails it
    is left byte for byte as it was; even a read would otherwise end in `PRAGMA optimize` or a
    journal written into it, and a damaged page can hide rows without any error."""
    sidecars = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    ours = [p for p in sidecars if not p.exists()]  # a WAL file's reader may create these
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        _remove_empty(ours)
        raise explain(exc, path) from None
    if rows != [("ok",)]:
        _remove_empty(ours)
        found = "; ".join(str(row[0]).replace("*** in database main ***", "").strip() for row in rows[:3])
        raise StoreError(
            f"{path} is damaged (SQLite quick_check: {found}). It was left unchanged: keep it for recovery "
            f"(`sqlite3 {path.name} .recover`), move it aside to start a new history there, or set {ENV_VAR} / "
            "--store to another file"
        )


def explain(exc: sqlite3.Error, path: Path) -> StoreError:
    """An SQLite error as a sentence about the file and the fix."""
    text = str(exc)
    lowered = text.lower()
    if "not a database" in lowered or "malformed" in lowered or "disk image" in lowered:
        return StoreError(
            f"{path} is not a readable workbench run history (SQLite: {text}). It was left unchanged: move it "
            f"aside (a new history is then started there) or set {ENV_VAR} / --store to another file"
        )
    if "locked" in lowered or "busy" in lowered:
        return StoreError(
            f"{path} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s (SQLite: {text}); "
            "retry, or look for a stuck process holding it"
        )
    if "readonly" in lowered or "unable to open" in lowered or "permission" in lowered:
        return StoreError(
            f"cannot write the run history {path} (SQLite: {text}); check its permissions or set {ENV_VAR}"
        )
    return StoreError(f"run history {path}: {text}")


# --- internals ----------------------------------------------------------------------


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL unless it is already. The switch needs the file to itself; while
    another process reads it (its integrity check, as several writers race to create one store)
    it failed here with "database is locked" despite the busy timeout: retry it until that timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _make_folder(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StoreError(
            f"cannot create the run history {path}: a part of its folder is a file, not a folder; "
            f"set {ENV_VAR} / --store to a path in a folder"
        ) from None
    except OSError as exc:
        raise StoreError(
            f"cannot create the run history {path}: {exc.strerror or exc} ({exc.filename or path.parent}); "
            f"set {ENV_VAR} / --store to a writable place, or --no-store to keep no history"
        ) from None


def _remove_empty(paths: list[Path]) -> None:
    """Remove the empty -wal/-shm files a failed check created, so the folder is as it was."""
    for p in paths:
        try:
            if p.stat().st_size <= 32768:  # an empty WAL, or the first block of a shared-memory index
                p.unlink()
        except OSError:
            pass


def _begin_immediate(conn: sqlite3.Connection, path: Path) -> None:
    for attempt in range(2):
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if attempt == 0 and ("locked" in str(exc) or "busy" in str(exc)):
                time.sleep(0.05)
                continue
            raise explain(exc, path) from None


def _check_and_migrate(conn: sqlite3.Connection, path: Path) -> None:
    current = schema.schema_version()
    found = _version(conn, path)  # raises on a corrupt, foreign or newer file
    if found == current:
        return
    if found > 0:
        _keep_copy(conn, path, found)
    with write_transaction(conn, path):
        found = _version(conn, path)  # another process may have migrated while we waited for the lock
        for version in range(found, current):
            for statement in schema.MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {current}")


def _version(conn: sqlite3.Connection, path: Path) -> int:
    """The store's schema version (0 for a new, empty file); StoreError for files we must not touch."""
    # One statement, one snapshot: read apart, a store another process is creating right now
    # could look like a foreign database (no id yet, but tables already).
    app_id, version, tables = conn.execute(
        "SELECT (SELECT application_id FROM pragma_application_id), (SELECT user_version FROM pragma_user_version), "
        "(SELECT count(*) FROM sqlite_master)"
    ).fetchone()
    if app_id == 0 and version == 0:
        if tables:
            raise StoreError(
                f"{path} is an SQLite database but not a workbench run history ({tables} foreign schema "
                f"objects). It was left unchanged; set {ENV_VAR} / --store to another file"
            )
        return 0
    if app_id != schema.APPLICATION_ID:
        raise StoreError(
            f"{path} is an SQLite database of another application (application_id {app_id:#x}). "
            f"It was left unchanged; set {ENV_VAR} / --store to another file"
        )
    if version > schema.schema_version():
        raise StoreError(
            f"{path} was written by a newer workbench (store schema {version}; this version reads up to "
            f"{schema.schema_version()}). It was left unchanged: upgrade training-workbench, or set {ENV_VAR} / "
            "--store to another file"
        )
    return int(version)


def _keep_copy(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """Before migrating a store with data, keep a consistent copy beside it (SQLite's backup API)."""
    backup = path.with_name(f"{path.name}.schema-v{version}.bak")
    if backup.exists():
        return
    partial = backup.with_name(backup.name + ".partial")
    target = sqlite3.connect(partial)
    try:
        conn.backup(target)
    finally:
        target.close()
    shutil.move(str(partial), backup)


class SqliteDatabase:
    """The SQLite file as the `Store` uses it: one connection, its write transaction, its errors explained."""

    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        self.conn = connect(path, create=create)
        self.conn.row_factory = sqlite3.Row

    def transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self.conn, self.path)

    def explain(self, exc: Exception) -> StoreError:
        return explain(exc, self.path) if isinstance(exc, sqlite3.Error) else StoreError(str(exc))

    def insert_id(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> int:
        """Run one INSERT and return the new row's id."""
        return int(conn.execute(sql, params).lastrowid or 0)

    def close(self, wrote: bool) -> None:
        try:
            if wrote:  # SQLite's advice on closing: keeps query plans good; a reader leaves the file be
                self.conn.execute("PRAGMA optimize")
        except sqlite3.Error:
            pass  # closing must not fail on a busy or read-only file
        self.conn.close()
