"""Counts the trial path's calls of `check_config` and `resolve_device`, in this process and in every
worker or rank it starts, into one log file (a line per call: name, pid, calling module).

A child learns to count through a `sitecustomize` put first on its PYTHONPATH (workers and torchrun
ranks inherit the caller's environment), so what is counted there is the real call, not a report.
Calls made inside the device module itself (`check_config` resolving its argument, `device_info`
reading one) are not the trial path's decisions and are not counted.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

LOG_ENV = "WORKBENCH_TEST_CALL_LOG"
COUNTED = ("check_config", "resolve_device")
_INSIDE = ("workbench.device", "workbench.levers")


def install(log: str) -> None:
    import workbench.device as device
    import workbench.levers as levers

    for name, module in (("check_config", levers), ("resolve_device", device)):
        original = getattr(module, name)

        def counted(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            caller = str(sys._getframe(1).f_globals.get("__name__", ""))
            if not caller.startswith(_INSIDE):
                with open(log, "a") as fh:
                    fh.write(f"{_name} {os.getpid()} {caller}\n")
            return _original(*args, **kwargs)

        setattr(module, name, counted)


def counting_environment(directory: Path, log: Path) -> dict[str, str]:
    """Environment variables that make every child started from now count into `log`."""
    hook = directory / "sitecustomize.py"
    hook.write_text(
        "import os, sys\n"
        f"if os.environ.get({LOG_ENV!r}):\n"
        f"    sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "    import call_count\n"
        f"    call_count.install(os.environ[{LOG_ENV!r}])\n"
    )
    path = os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, LOG_ENV: str(log)}


def counts(log: Path) -> Counter[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[0] for line in lines)
