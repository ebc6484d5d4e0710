"""Run history: every finished trial in an embedded SQLite file (or a team's PostgreSQL database), and
the queries regression checks need.

`measure` does not know this package (it sits below it); `workbench.api` saves what it
runs here unless told `store=None`. See `db.py` for the file and its guarantees,
`records.py` for what counts as the same configuration and comparable hardware.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator
from contextlib import contextmanager

from workbench.store.core import HistoryRow, RunRecorder, Store
from workbench.store.location import (
    ENV_VAR,
    StoreError,
    default_store_path,
    is_database_url,
    shown_store,
    store_exists,
)
from workbench.store.records import StoredTrial, config_key, env_key
from workbench.store.reference import Reference, UnknownReference, parse_reference


class _Default(enum.Enum):
    STORE = "default store"


#: `store=DEFAULT_STORE` (the API's default): the user's history file, unless WORKBENCH_STORE=off.
DEFAULT_STORE = _Default.STORE
StoreArg = Store | str | os.PathLike[str] | _Default | None


@contextmanager
def opened_store(store: StoreArg, *, create: bool = True) -> Iterator[Store | None]:
    """What an API `store=` argument means, opened for the `with` block (and closed if opened here).

    DEFAULT_STORE: the default file (or URL), or None when WORKBENCH_STORE=off; None: no store;
    a path: that file; a postgresql:// URL: that database; a Store: itself, left open.
    """
    if isinstance(store, Store) or store is None:
        yield store
        return
    if store is DEFAULT_STORE:
        path = default_store_path()
        if path is None:
            yield None
            return
    else:
        path = store  # type: ignore[assignment]
    opened = Store(path, create=create)
    try:
        yield opened
    finally:
        opened.close()


__all__ = [
    "DEFAULT_STORE",
    "ENV_VAR",
    "HistoryRow",
    "Reference",
    "RunRecorder",
    "Store",
    "StoreArg",
    "StoreError",
    "StoredTrial",
    "UnknownReference",
    "config_key",
    "default_store_path",
    "env_key",
    "is_database_url",
    "opened_store",
    "parse_reference",
    "shown_store",
    "store_exists",
]
