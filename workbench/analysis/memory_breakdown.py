"""Memory at the step's peak, by category and by the modules that hold the most activations.

Pure shaping of what the tracked step recorded (`TrialResult.memory_breakdown` and
`.memory_modules`, or a `MemoryEstimate`), so the UI, the CLI and notebooks show the
same rows. Modules nest (a block contains its layers), so the module rows are taken at
one depth of the module tree: the shallowest depth at which the activations split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The order categories are shown in: what the model is, then what training adds.
CATEGORY_ORDER = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries", "other")


@dataclass(frozen=True)
class MemoryRow:
    label: str
    bytes: int
    share: float
    """Of the peak (categories) or of all activations at this depth (modules)."""


def category_rows(breakdown: Mapping[str, int] | None) -> list[MemoryRow]:
    """Non-empty categories in a fixed order, with their share of the peak."""
    if not breakdown:
        return []
    total = sum(breakdown.values()) or 1
    known = [name for name in CATEGORY_ORDER if breakdown.get(name)]
    extra = sorted(name for name in breakdown if name not in CATEGORY_ORDER and breakdown[name])
    return [MemoryRow(name, int(breakdown[name]), breakdown[name] / total) for name in known + extra]


def module_rows(modules: Mapping[str, Mapping[str, int]] | None, top: int = 8) -> list[MemoryRow]:
    """The `top` modules by activations held after their forward, at the first depth that splits them."""
    if not modules:
        return []
    named = {name: stats for name, stats in modules.items() if name}
    if not named:
        return []
    depth = _splitting_depth(named)
    level = {name: int(stats.get("activations", 0)) for name, stats in named.items() if name.count(".") == depth}
    total = sum(level.values()) or 1
    ranked = sorted(level.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [MemoryRow(name, value, value / total) for name, value in ranked if value > 0]


def _splitting_depth(modules: Mapping[str, Mapping[str, int]]) -> int:
    """The shallowest depth with at least two modules holding activations (a lone wrapper says nothing)."""
    deepest = max(name.count(".") for name in modules)
    for depth in range(deepest + 1):
        holding = [n for n, s in modules.items() if n.count(".") == depth and s.get("activations", 0) > 0]
        if len(holding) >= 2:
            return depth
    return 0
