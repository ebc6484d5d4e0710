"""Watching a user's own training job: step, data wait, phases, memory and utilization from their loop.

`watch(model, optimizer, name=...)` is the entry point (`wb.watch`). The loop only takes
stamps; `writer.py`'s thread stores the run while it runs (`workbench.store.watched`).
"""

from workbench.watch.session import Watch, WatchWarning, watch

__all__ = ["Watch", "WatchWarning", "watch"]
