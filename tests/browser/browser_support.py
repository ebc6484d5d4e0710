"""What every real-browser test needs: Debian's Chromium, its flags here, a skip reason, a free port.

FIELD-NOTES: launch /usr/bin/chromium (never `playwright install`, nothing can be downloaded)
with flags that keep it off the closed network.
"""

from __future__ import annotations

import socket
import subprocess
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
    """End a server the test started: terminate, then kill if it does not go within 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
