"""The lever layout: old import paths still work (with a warning), and every lever is whole."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter: a module imported once by another test would not warn again here."""
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_old_optimizations_package_warns_and_forwards_to_levers() -> None:
    warned = _run("import workbench.optimizations")
    assert warned.returncode != 0 and "workbench.levers" in warned.stderr, warned.stderr[-2000:]
    same = _run(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import importlib, sys\n"
        "old = importlib.import_module('workbench.optimizations.offload')\n"
        "assert old is sys.modules['workbench.levers.offload'], old\n"
        "from workbench.optimizations import build\n"
        "from workbench.levers import build as new_build\n"
        "assert build is new_build, build  # the function, as before\n"
        "print('ok')"
    )
    assert same.stdout.strip() == "ok", same.stderr[-2000:]
