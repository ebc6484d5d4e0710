"""The built-in workloads' catalog: `@register(name, description)` puts a builder in it.

Apart from `registry` (which loads workloads by name) so the built-in modules can register
themselves without importing the loader that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.workloads.base import Workload


@dataclass(frozen=True)
class BuiltinWorkload:
    name: str
    builder: Callable[..., Workload]
    """`builder(preset, **options)` -> Workload."""
    description: str


BUILTINS: dict[str, BuiltinWorkload] = {}


def register(name: str, description: str) -> Callable[[Callable[..., Workload]], Callable[..., Workload]]:
    """Decorator: make `builder(preset, **options)` available by name."""

    def wrap(builder: Callable[..., Workload]) -> Callable[..., Workload]:
        BUILTINS[name] = BuiltinWorkload(name, builder, description)
        return builder

    return wrap
