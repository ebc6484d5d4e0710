"""What every real-browser test needs: Debian's Chromium, its flags here, a skip reason, a free port.

Launch /usr/bin/chromium (never `playwright install`: nothing can be downloaded on these hosts)
with flags that keep it off the closed network.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def skip_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (scripts/install-browser installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is missing (pip install -e '.[dev]'; never `playwright install`)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a server the test started: terminate, then kill if it does not go within 5 s.

    A healthy JupyterLab server exits in about 2 s; one whose SIGTERM lands while a kernel is still
    starting (a notebook the test just opened) fails its own clean-up (jupyter_server's
    `cleanup_kernels` raises HTTP 404 for the kernel not yet registered) and never exits. Its
    kernels end on their own once it is gone ("Parent appears to have exited")."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def jupyterlab(home: Path, root: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """JupyterLab serving `root` on 127.0.0.1 and a free port, token off, settings and runtime under
    `home` (news and update checks off: no pop-ups over what a test clicks); yields its URL once
    /api/status answers, and stops it on exit."""
    settings = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {
        **(env or os.environ),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    command = [
        sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}", "--IdentityProvider.token=", "--ServerApp.password=",
        f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}", "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    log_path = home / "lab.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc, log_path)
        yield url
    finally:
        stop(proc)


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path, token: str = "", timeout_s: float = 90) -> None:
    """Until the server at `url` answers its status API; its log's tail in the error if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not answer in {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")
