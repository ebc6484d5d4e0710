"""Plain-text tables, sizes and durations for the terminal, and the parsing of sizes and durations
a person types (the CLI's flags and the app's text boxes read them alike).

Hand-written (a few dozen lines) rather than a dependency: the CLI must run on GPU
machines where only torch and numpy are installed (`scripts/gpu-check` runs it there).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from workbench.config import ConfigError


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned first column, right-aligned numbers, one space-padded line per row."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def format_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    sign = "-" if value < 0 else ""
    value = abs(float(value))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    return f"{sign}{value:.1f} TiB"


def format_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*")
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*", re.IGNORECASE)
_SECONDS = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_bytes(text: str) -> int:
    """'80GB' (decimal, as GPUs are sold) or '75GiB' or a plain number of bytes."""
    match = _SIZE.fullmatch(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"memory budget '{text}' is not a size; write e.g. 80GB, 75GiB or 1000000000")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_duration(text: str) -> float:
    """'600', '90s', '10m', '1h' -> seconds."""
    match = _DURATION.fullmatch(str(text))
    if not match:
        raise ConfigError(f"budget '{text}' is not a duration; write e.g. 600, 90s, 10m or 1h")
    unit = match.group(2).lower() if match.group(2) else None
    return float(match.group(1)) * _SECONDS[unit]
