"""A throw-away local PostgreSQL: `initdb` into a temporary folder, a free port, stopped and deleted at the end.

For trying the shared run history and the shared tuning study on one machine, and for the tests
(which must run against a real server, never a mock). Never a team's history: it runs with
`fsync=off` and trust authentication on 127.0.0.1, and its folder is deleted when it stops.
`initdb` refuses to run as root, so as root the server runs as the `postgres` user (or `nobody`).

    python -m workbench.store.throwaway_pg     # prints the URL, keeps running until Ctrl-C
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

from workbench.store.location import StoreError

#: Debian's `postgresql` package keeps the server binaries here, off PATH.
DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"


def server_binaries() -> Path:
    """The folder holding `initdb` and `pg_ctl`: on PATH, else Debian's newest version; StoreError if neither."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob(DEBIAN_BINARIES), key=lambda p: int(Path(p).parent.name.split(".")[0] or 0))
    for folder in reversed(versions):
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    raise StoreError(
        "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin; "
        "install them (Debian/Ubuntu: apt-get install -y postgresql)"
    )


class ThrowawayPostgres:
    """One local cluster: `start()` returns the URL of its `postgres` database; `stop()` removes it all."""

    def __init__(self) -> None:
        self.binaries = server_binaries()
        self.user = _unprivileged_user()
        self.folder = Path(tempfile.mkdtemp(prefix="workbench-pg-"))
        self.data = self.folder / "data"
        self.port = 0
        if self.user is not None:
            os.chown(self.folder, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def start(self) -> str:
        """Start (or restart, on the same port once one was chosen) the server; its URL."""
        self.port = self.port or free_port()
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-o", options, "-w", "start")
        return self.url

    def stop(self, *, remove: bool = True) -> None:
        """Stop the server (immediately: nothing here is worth a checkpoint); remove its folder unless told not."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        if remove:
            shutil.rmtree(self.folder, ignore_errors=True)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database on this server (a fresh one per test); its URL."""
        import psycopg

        name = name or f"wb_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        command = [str(self.binaries / tool), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user.pw_name, "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if check and proc.returncode != 0:
            log = self.folder / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise StoreError(f"{tool} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}\n{tail}")


def free_port() -> int:
    """A TCP port nobody listens on now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unprivileged_user() -> pwd.struct_passwd | None:
    """Who runs the server when we are root (initdb refuses root): `postgres` if it exists, else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise StoreError("running as root, and neither a 'postgres' nor a 'nobody' user exists to run initdb as")


def main() -> int:
    server = ThrowawayPostgres()
    try:
        server.start()
        history, study = server.create_database("workbench"), server.create_database("studies")
        print(
            "throw-away PostgreSQL running; its data is deleted when this stops (Ctrl-C)\n\n"
            f"  export WORKBENCH_STORE={history}\n"
            f"  workbench tune --storage {study} --study my-search ...\n",
            flush=True,
        )
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    raise SystemExit(main())
