"""The run history on PostgreSQL: a team's shared history, with the SQLite file's schema and promises.

psycopg 3 directly, not SQLAlchemy: the store's SQL is written once, for sqlite3's `?`
placeholders and name-or-index rows, and this module gives a psycopg connection that face
(`PgConnection`), so every query runs unchanged on both. SQLAlchemy Core would mean rewriting
each query as `text()` with named binds (or as Core expressions) and a second connection layer
in the SQLite path; it brings nothing the store needs. Optuna's study storage does use it
(through the same psycopg driver).

Promises, as for the file: a trial is written in one transaction (a killed writer's open
transaction is rolled back by the server); concurrent writers are the server's business (MVCC);
migrations run in one transaction under an advisory lock, so two processes opening a new
database do not both create it; a newer schema or a database holding other tables is refused
by name and left unchanged. A connection lost mid-use is reopened on the next use.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from workbench.store import schema
from workbench.store.location import ENV_VAR, StoreError, redacted

try:
    import psycopg
except ImportError:  # the SQLite default needs nothing; the error says how to get it when a URL is given
    psycopg = None  # type: ignore[assignment]

#: How long opening a connection may take before the server counts as unreachable.
CONNECT_TIMEOUT_S = 10
FIX_URL = f"set --store / {ENV_VAR} to postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"


class PostgresDatabase:
    """One connection to a PostgreSQL history, as the `Store` uses it (the counterpart of `SqliteDatabase`)."""

    errors: tuple[type[Exception], ...] = (psycopg.Error,) if psycopg is not None else ()

    def __init__(self, url: str, *, create: bool) -> None:
        self.url, self.path = url, redacted(url)
        self._conn = connect(url, create=create)

    @property
    def conn(self) -> PgConnection:
        """The connection, reopened (and the schema checked again) if the server dropped it."""
        if self._conn.raw.closed or self._conn.raw.broken:
            self._conn = connect(self.url, create=False)
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PgConnection]:
        conn = self.conn
        try:
            with conn.raw.transaction():
                yield conn
        except psycopg.Error as exc:
            raise explain(exc, self.path) from None

    def explain(self, exc: Exception) -> StoreError:
        return explain(exc, self.path)

    def insert_id(self, conn: PgConnection, sql: str, params: Sequence[Any]) -> int:
        """Run one INSERT and return the new row's id (psycopg has no `lastrowid`)."""
        return int(conn.execute(sql + " RETURNING id", params).fetchone()[0])

    def close(self, wrote: bool) -> None:
        self._conn.raw.close()


class Row:
    """A result row read by column name or by position, like sqlite3.Row (so one SQL serves both)."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values, self._index = values, index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._index[key] if isinstance(key, str) else key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._index)


class PgConnection:
    """A psycopg connection that takes the store's sqlite3-style SQL (`?` placeholders)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.raw.execute(postgres_sql(sql), tuple(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        cursor = self.raw.cursor()
        cursor.executemany(postgres_sql(sql), [tuple(r) for r in rows])
        return cursor


@functools.lru_cache(maxsize=256)
def postgres_sql(sql: str) -> str:
    """sqlite3-style SQL as psycopg takes it: `?` -> `%s`, a literal `%` doubled, and SQLite's
    byte-order collation (the commit-prefix range scans) as PostgreSQL's "C"."""
    return sql.replace("%", "%%").replace("?", "%s").replace("COLLATE BINARY", 'COLLATE "C"')


def connect(url: str, *, create: bool) -> PgConnection:
    """Open `url`, refuse anything that is not a workbench history we can read, create or migrate ours.

    `create` does not apply: the database itself is what must exist (a missing one is an error
    naming it); an empty one gets the history's tables on first use, by any command, so reading
    an empty shared history is "nothing stored yet", as for a file not written yet."""
    shown = redacted(url)
    if psycopg is None:
        raise StoreError(
            f"the run history {shown} is on PostgreSQL, which needs psycopg: pip install 'psycopg[binary]'"
        )
    _check_url(url, shown)
    try:
        raw = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, row_factory=_row_factory)
    except psycopg.Error as exc:
        raise explain(exc, shown) from None
    conn = PgConnection(raw)
    try:
        _check_and_migrate(conn, shown, create)
    except BaseException:
        raw.close()
        raise
    return conn


def explain(exc: BaseException, shown: str) -> StoreError:
    """A psycopg error as a sentence about the server and the fix."""
    text = " ".join(str(exc).split())
    lowered = text.lower()
    where = _host_port(shown)
    if "does not exist" in lowered and "database" in lowered:
        name = urlsplit(shown).path.lstrip("/") or "?"
        return StoreError(
            f"the database '{name}' does not exist on {where} ({shown}); create it (`createdb -h HOST -p PORT {name}`"
            f" or `psql -c 'CREATE DATABASE {name}'`) or {FIX_URL}"
        )
    if "connection refused" in lowered or "no such file or directory" in lowered:
        return StoreError(
            f"nothing answers at {where} ({shown}): is the PostgreSQL server running there? Check the host and port, "
            f"or start a local one to try it (`scripts/throwaway-postgres`); {FIX_URL}"
        )
    if "translate host name" in lowered or "name or service not known" in lowered:
        return StoreError(f"unknown host in {shown} ({text}); {FIX_URL}")
    if "password" in lowered or "authentication" in lowered or ("role" in lowered and "does not exist" in lowered):
        return StoreError(f"the server at {where} refused the login in {shown} ({text}); check the user and password")
    if "timeout" in lowered or "timed out" in lowered:
        return StoreError(
            f"no answer from {where} within {CONNECT_TIMEOUT_S} s ({shown}); check the host, port and firewall"
        )
    if isinstance(exc, psycopg.OperationalError) or "closed" in lowered or "terminat" in lowered:
        return StoreError(
            f"lost the connection to the run history {shown} ({text}); the server went away or restarted: "
            "it is reopened on the next use once the server is back"
        )
    return StoreError(f"run history {shown}: {text}")


# --- internals ----------------------------------------------------------------------


def _row_factory(cursor: Any) -> Any:
    index = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: Row(values, index)


def _check_url(url: str, shown: str) -> None:
    """A malformed URL is refused here, in words, before libpq's own message about a 'conninfo string'."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise StoreError(f"{shown} is not a PostgreSQL URL ({exc}); {FIX_URL}") from None
    if not parts.path.strip("/") or port == 0:
        raise StoreError(f"{shown} names no database; {FIX_URL}")


def _host_port(shown: str) -> str:
    try:
        parts = urlsplit(shown)
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
    except ValueError:
        return shown


def _check_and_migrate(conn: PgConnection, shown: str, create: bool) -> None:
    current = schema.schema_version()
    found = _version(conn, shown)  # raises on a foreign database or a newer schema
    if found == current:
        return
    try:
        with conn.raw.transaction():
            # DDL is transactional here too: the whole upgrade lands, or none of it. The lock keeps two
            # processes opening a new database from both creating it.
            conn.execute("SELECT pg_advisory_xact_lock(?)", (schema.APPLICATION_ID,))
            found = _version(conn, shown)
            for version in range(found, current):
                for statement in schema.MIGRATIONS[version]:
                    conn.execute(schema.postgres_statement(statement))
            table = schema.POSTGRES_VERSION_TABLE
            if found == 0:
                conn.execute(f"CREATE TABLE {table} (application_id BIGINT NOT NULL, version BIGINT NOT NULL)")
                conn.execute(f"INSERT INTO {table} VALUES (?, ?)", (schema.APPLICATION_ID, current))
            else:
                conn.execute(f"UPDATE {table} SET version = ?", (current,))
    except psycopg.Error as exc:
        raise explain(exc, shown) from None


def _version(conn: PgConnection, shown: str) -> int:
    """The history's schema version (0 for an empty database); StoreError for databases we must not touch."""
    table = schema.POSTGRES_VERSION_TABLE
    ours, tables = conn.execute(
        "SELECT to_regclass(?) IS NOT NULL, (SELECT count(*) FROM information_schema.tables "
        "WHERE table_schema = current_schema())",
        (table,),
    ).fetchone()
    if not ours:
        if tables:
            raise StoreError(
                f"{shown} holds {tables} tables but no workbench run history. It was left unchanged: give the history "
                f"a database of its own (`createdb workbench`), or {FIX_URL}"
            )
        return 0
    app_id, version = conn.execute(f"SELECT application_id, version FROM {table}").fetchone()
    if app_id != schema.APPLICATION_ID:
        raise StoreError(f"{shown} has a '{table}' table of another application. It was left unchanged; {FIX_URL}")
    if version > schema.schema_version():
        raise StoreError(
            f"{shown} was written by a newer workbench (store schema {version}; this version reads up to "
            f"{schema.schema_version()}). It was left unchanged: upgrade training-workbench, or {FIX_URL}"
        )
    return int(version)
