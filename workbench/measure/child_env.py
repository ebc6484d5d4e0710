"""The environment a trial worker starts with (its own module: the worker launcher and the compile
cache's fresh-cache environment both build on it, and neither should import the other)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def child_environment() -> dict[str, str]:
    """The caller's environment plus its import path: modules a notebook or script imported by
    path (a 'package.module:attr' workload) must import in the child too."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root, *(p or os.getcwd() for p in sys.path), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p and os.path.isdir(p)))
    return env
