"""`Applied`: one line of the record of what `build()` really did to the model and the step.

A toggle that silently did nothing is the failure this record exists to expose, so each
entry carries a `detail` written from what happened (modules wrapped, parameters converted),
not from what was asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Applied:
    """One toggle as applied: its config field, its value and what really happened."""

    toggle: str
    """Config field name, e.g. 'activation_checkpointing'."""
    value: Any
    """The value applied."""
    detail: str
    """What happened, e.g. 'wrapped 4 ResBlock modules: backbone.0, backbone.1, ...'."""

    def __str__(self) -> str:
        return f"{self.toggle}={self.value}: {self.detail}"


def name_list(names: list[str], limit: int = 6) -> str:
    """'a, b, c' — at most `limit` names, then '... (+N more)'; keeps details readable."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... (+{len(names) - limit} more)" if len(names) > limit else "")
