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


def test_the_moved_device_functions_warn_and_forward_to_levers() -> None:
    from workbench import levers

    for name in ("capabilities", "check_config", "capabilities_report"):
        warned = _run(f"import workbench.device as d; d.{name}")
        assert warned.returncode != 0 and f"workbench.levers.{name}" in warned.stderr, warned.stderr[-2000:]
        forwarded = _run(
            "import warnings; warnings.simplefilter('ignore')\n"
            f"import workbench.device as d, workbench.levers as l\nassert d.{name} is l.{name}\nprint('ok')"
        )
        assert forwarded.stdout.strip() == "ok", forwarded.stderr[-2000:]
        assert callable(getattr(levers, name))


def test_device_facts_never_reach_up_into_the_levers_but_for_the_shim() -> None:
    """Layers point one way: device.py imports levers only inside its deprecation `__getattr__`."""
    import ast
    import inspect

    from workbench import device

    tree = ast.parse(inspect.getsource(device))
    shim = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
    inside_shim = {id(n) for n in ast.walk(shim)}
    reaching_up = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(up in ast.unparse(node) for up in ("workbench.levers", "workbench.optimizations"))
        and id(node) not in inside_shim
    ]
    assert reaching_up == []
    assert any("workbench.levers" in ast.unparse(n) for n in ast.walk(shim) if isinstance(n, ast.Import))
