"""A subpackage that is also the public function of the same name (`wb.tune(...)`, `wb.export(...)`).

`workbench.tune` is a package *and* `wb.tune` is the tuner. Once the package is imported, Python
binds the name `tune` in `workbench` to the module, whatever `workbench/__init__.py` said, so the
function is reached through the module: the module calls it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any


def make_callable(module_name: str, function: Callable[..., Any]) -> None:
    """Calling module `module_name` calls `function` (same arguments, same result)."""

    class CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

    CallableModule.__call__.__doc__ = function.__doc__
    sys.modules[module_name].__class__ = CallableModule
