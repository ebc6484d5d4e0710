"""Test-session settings shared by every test file."""

from __future__ import annotations

import os
from pathlib import Path

# One inductor cache for the whole session (and across sessions on one machine): a cold
# compile costs ~1 min on 2 cores, a warm one seconds (FIELD-NOTES).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".inductor-cache"))
