"""Test-session settings shared by every test file."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from workbench.store.throwaway_pg import ThrowawayPostgres

# One inductor cache for the whole session (and across sessions on one machine): a cold
# compile costs ~1 min on 2 cores, a warm one seconds (measured: 50-65 s cold, 6-8 s warm).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".inductor-cache"))

# Trials run by tests are saved to a throw-away run history, never the user's own (even when
# WORKBENCH_STORE points at it): set before any test, so CLI subprocesses inherit it too.
_STORE_DIR = tempfile.mkdtemp(prefix="workbench-test-store-")
os.environ["WORKBENCH_STORE"] = str(Path(_STORE_DIR) / "history.sqlite")
atexit.register(shutil.rmtree, _STORE_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[ThrowawayPostgres]:
    """One throw-away PostgreSQL for the session (started only when a test asks for it; never skipped:
    without the server binaries this fails, naming how to install them)."""
    from workbench.store.throwaway_pg import ThrowawayPostgres

    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: ThrowawayPostgres) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.create_database()
