"""Where the run history lives: an SQLite file (the default, no server) or a PostgreSQL URL (a team's history).

One reading of `--store` / `WORKBENCH_STORE` for every command, the API and the app, so a URL
works wherever a path does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ENV_VAR = "WORKBENCH_STORE"
#: Values of WORKBENCH_STORE that turn default saving off.
DISABLED_VALUES = ("off", "none", "false", "0")
#: What a PostgreSQL store's location starts with (libpq's own URI schemes).
URL_SCHEMES = ("postgresql://", "postgres://")


class StoreError(Exception):
    """The run history cannot be used; the message names the file (or server) and what to do."""


def is_database_url(target: object) -> bool:
    """A PostgreSQL URL rather than a file path."""
    return isinstance(target, str) and target.strip().lower().startswith(URL_SCHEMES)


def default_store_path() -> Path | str | None:
    """$WORKBENCH_STORE (a file, or a postgresql:// URL kept as text), else
    `<user data dir>/workbench/history.sqlite`; None when WORKBENCH_STORE=off."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in DISABLED_VALUES:
        return None
    if is_database_url(value):
        return value
    if value:
        return Path(value).expanduser()
    return user_data_dir() / "workbench" / "history.sqlite"


def store_exists(target: Path | str) -> bool:
    """Whether there may be history to read: a file that exists; a server always (it answers for itself)."""
    return is_database_url(target) or Path(target).exists()


def redacted(url: str) -> str:
    """The URL as shown in messages: its password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def shown_store(target: Path | str) -> str:
    """The history's location as shown to a user or a browser: a file's path, a URL without its password."""
    return redacted(str(target)) if is_database_url(target) else str(target)


def user_data_dir() -> Path:
    """The platform's per-user data folder (XDG on Linux), without a dependency for it."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support"
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
