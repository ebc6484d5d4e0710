"""The run history on PostgreSQL, beyond the shared store tests (tests/test_store.py runs those on both):
what only a server has — a newer or foreign database refused by name, migrations in one transaction,
a wrong URL, a refused connection or a missing database in one line with the fix, another process's
runs read by `history`, and a server that restarts under an open store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_regress import SUITE
from test_store import fake_result

from workbench.store import Store, StoreError, schema
from workbench.store.throwaway_pg import ThrowawayPostgres


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _sql(url: str, statement: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else None


def test_a_newer_schema_is_refused_by_name_and_left_unchanged(postgres_url: str) -> None:
    with Store(postgres_url) as opened:
        opened.save_run([fake_result()])
    _sql(postgres_url, f"UPDATE {schema.POSTGRES_VERSION_TABLE} SET version = {schema.schema_version() + 5}")
    with pytest.raises(StoreError, match="newer workbench") as info:
        Store(postgres_url)
    assert postgres_url in str(info.value) and "upgrade training-workbench" in str(info.value)
    assert _sql(postgres_url, "SELECT count(*) FROM trials") == [(1,)]


def test_a_database_of_other_tables_is_refused_and_left_unchanged(postgres_url: str) -> None:
    _sql(postgres_url, "CREATE TABLE songs (title TEXT)")
    with pytest.raises(StoreError, match="no workbench run history") as info:
        Store(postgres_url)
    assert "createdb workbench" in str(info.value)
    tables = _sql(postgres_url, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
    assert tables == [("songs",)]


def test_migrations_upgrade_in_one_transaction(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(postgres_url) as opened:
        kept = fake_result()
        opened.save_run([kept])
    version = schema.schema_version()
    broken = [*schema.MIGRATIONS, ["ALTER TABLE trials ADD COLUMN note TEXT", "THIS IS NOT SQL"]]
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    with pytest.raises(StoreError):
        Store(postgres_url)
    assert _sql(postgres_url, f"SELECT version FROM {schema.POSTGRES_VERSION_TABLE}") == [(version,)]
    columns = _sql(postgres_url, "SELECT column_name FROM information_schema.columns WHERE table_name = 'trials'")
    assert ("note",) not in columns  # the first statement was rolled back with the failing one
    monkeypatch.setattr(schema, "MIGRATIONS", [*broken[:-1], ["ALTER TABLE trials ADD COLUMN note TEXT"]])
    with Store(postgres_url) as migrated:
        assert migrated.get(kept.trial_id).result.to_dict() == kept.to_dict()
    assert _sql(postgres_url, f"SELECT version FROM {schema.POSTGRES_VERSION_TABLE}") == [(version + 1,)]


def test_large_numbers_and_exact_times_keep_their_precision(postgres_url: str) -> None:
    """PostgreSQL's INTEGER and REAL are narrower than SQLite's: the schema must not use them as they are."""
    result = fake_result(started_at=1_796_670_357.917_302_8)
    result.peak_memory_bytes = 80 * 2**30
    with Store(postgres_url) as opened:
        opened.save_run([result])
        again = opened.get(result.trial_id).result
    assert again.peak_memory_bytes == 80 * 2**30 and again.started_at == result.started_at


@pytest.mark.parametrize(
    ("mistake", "says"),
    [
        ("missing database", "does not exist"),
        ("refused", "nothing answers at 127.0.0.1"),
        ("not a port", "is not a PostgreSQL URL"),
        ("no database", "names no database"),
    ],
)
def test_a_wrong_url_is_one_line_with_the_fix_and_exit_2(
    postgres_server: ThrowawayPostgres, mistake: str, says: str
) -> None:
    url = {
        "missing database": postgres_server.database_url("no_such_history"),
        "refused": f"postgresql://postgres@127.0.0.1:{_closed_port()}/workbench",
        "not a port": "postgresql://postgres@127.0.0.1:fivefour/workbench",
        "no database": f"postgresql://postgres@127.0.0.1:{postgres_server.port}",
    }[mistake]
    proc = _cli("history", "--store", url)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert says in proc.stderr and "WORKBENCH_STORE" in proc.stderr, proc.stderr


def test_an_empty_database_is_an_empty_history_not_an_error(postgres_url: str) -> None:
    proc = _cli("history", "--store", postgres_url)
    assert proc.returncode == 0 and "no stored trials match" in proc.stdout, proc.stdout + proc.stderr


def test_history_reads_a_run_another_process_wrote_through_the_env_var(postgres_url: str) -> None:
    spec = "test_store:tiny_workload"
    env = {
        "WORKBENCH_STORE": postgres_url,
        "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
    }
    ran = _cli("run", "--workload", spec, "--steps", "1", "--warmup", "1", "--quiet", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    shown = _cli("history", "--json", "--store", postgres_url)
    assert shown.returncode == 0, shown.stderr
    assert '"workload": "tiny-linear"' in shown.stdout and '"kind": "run"' in shown.stdout
    with Store(postgres_url, create=False) as opened:
        assert opened.count() == 1


def test_regress_reads_runs_another_process_wrote(postgres_url: str, tmp_path: Path) -> None:
    tests = os.path.dirname(__file__)
    writer = f"import sys; sys.path.insert(0, {tests!r}); import test_regress as t; list(t.write_history({postgres_url!r}, 4))"
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=120)
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(SUITE))
    proc = _cli("regress", "--suite", str(suite), "--from-store", "--store", postgres_url)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the plain configuration got 30% slower at commit C
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("plain", "bf16"))}
    assert "REGRESSION" in lines["plain"] and lines["bf16"].rstrip().endswith("pass")


def test_a_server_that_restarts_under_an_open_store_is_reconnected() -> None:
    with ThrowawayPostgres() as server:
        url = server.create_database()
        with Store(url) as opened:
            opened.save_run([fake_result()])
            server.stop(remove=False)
            with pytest.raises(StoreError, match=r"nothing answers|lost the connection"):
                opened.save_run([fake_result()])
            server.start()
            opened.save_run([fake_result()])  # the store reopens its connection on the next use
            assert opened.count() == 2


def _closed_port() -> int:
    from workbench.store.throwaway_pg import free_port

    return free_port()
