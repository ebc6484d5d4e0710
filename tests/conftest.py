"""Test-session settings shared by every test file."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# One inductor cache for the whole session (and across sessions on one machine): a cold
# compile costs ~1 min on 2 cores, a warm one seconds (measured: 50-65 s cold, 6-8 s warm).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".inductor-cache"))

# Trials run by tests are saved to a throw-away run history, never the user's own (even when
# WORKBENCH_STORE points at it): set before any test, so CLI subprocesses inherit it too.
_STORE_DIR = tempfile.mkdtemp(prefix="workbench-test-store-")
os.environ["WORKBENCH_STORE"] = str(Path(_STORE_DIR) / "history.sqlite")
atexit.register(shutil.rmtree, _STORE_DIR, ignore_errors=True)
