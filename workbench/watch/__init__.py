"""Watching a user's own training job: step, data wait, phases, memory and utilization from their loop.

`watch(model, optimizer, name=...)` is the entry point; `wb.watch(...)` calls it. The loop only takes
stamps; `writer.py`'s thread stores the run while it runs (`workbench.store.watched`). Under torchrun
every rank writes its own run; `watched_job(name)` joins them (rank skew, the straggler).
"""

from workbench.callable_module import make_callable
from workbench.watch.job import WatchedJob, watched_job
from workbench.watch.profiling import WatchProfile
from workbench.watch.reproduce import Reproduction, reproduce
from workbench.watch.requests import profile_job, watch_windows
from workbench.watch.session import Watch, WatchWarning, watch

# `wb.watch(...)` is this package called: importing it binds `workbench.watch` to the module.
make_callable(__name__, watch)

__all__ = [
    "Reproduction",
    "Watch",
    "WatchProfile",
    "WatchWarning",
    "WatchedJob",
    "profile_job",
    "reproduce",
    "watch",
    "watch_windows",
    "watched_job",
]
