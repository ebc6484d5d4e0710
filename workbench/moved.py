"""Module paths that moved: the old path stays importable for one release and says where its names went."""

from __future__ import annotations

import warnings


def warn_moved(old: str, new: str) -> None:
    """Called by the old module on import: one DeprecationWarning naming the new home."""
    warnings.warn(f"{old} is deprecated: import from {new} instead (the old path goes away in the next release)",
                  DeprecationWarning, stacklevel=3)  # fmt: skip
