"""Deprecated alias of `workbench.levers`, kept for one release so old imports keep working.

`import workbench.optimizations.build` (any submodule) resolves to the module of the same name
in `workbench.levers`: the very same module object, not a copy.
"""

from __future__ import annotations

import importlib
import sys
import warnings

warnings.warn(
    "workbench.optimizations is now workbench.levers; import from workbench.levers "
    "(this alias goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)

_SUBMODULES = (
    "amp",
    "attention",
    "build",
    "checkpointing",
    "compile",
    "compiled_autograd",
    "cuda_graphs",
    "distributed",
    "flex_attention",
    "float8",
    "memory_budget",
    "memory_format",
    "offload",
    "optimizer",
    "precision",
    "record",
    "threads",
)
for _name in _SUBMODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"workbench.levers.{_name}")

from workbench.levers import *  # noqa: E402, F403
from workbench.levers import __all__  # noqa: E402, F401
