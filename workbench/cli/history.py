"""`workbench history`: stored trials, newest first; `workbench job`: a watched torchrun job's ranks joined."""

from __future__ import annotations

import argparse
import json
from typing import Any

from workbench.cli.options import UsageError, add_store_arg, config_from


def add_commands(sub: Any) -> None:
    history = sub.add_parser("history", help="stored trials and watched runs (kind watch), newest first")
    history.add_argument("--workload", default=None, help="only this workload")
    history.add_argument("--config", default=None, metavar="K=V[,K=V]",
                         help="only this exact configuration ('' for the defaults)")  # fmt: skip
    history.add_argument("--commit", default=None, help="only trials at this git commit (sha or prefix)")
    history.add_argument("--since", default=None, metavar="YYYY-MM-DD", help="only trials started on or after")
    history.add_argument("--limit", type=int, default=20, help="most rows to show (default 20)")
    add_store_arg(history)
    history.add_argument("--json", action="store_true")
    history.set_defaults(handler=_cmd_history)

    job = sub.add_parser("job", help="a watched multi-process job: each rank's figures, the rank skew, the straggler")
    job.add_argument("job", help="the watch name (its newest launch) or a job id from `history --json`")
    add_store_arg(job)
    job.add_argument("--json", action="store_true")
    job.set_defaults(handler=_cmd_job)


def _newest_first(row: Any) -> float:
    """Trials by when they were saved, watched runs by when they started: newest first."""
    return -(row.started_at if row.kind == "watch" else row.saved_at)


def _cmd_job(args: argparse.Namespace) -> int:

    from workbench.store import default_store_path, store_exists
    from workbench.watch.job import watched_job

    path = args.store or default_store_path()
    if path is None or not store_exists(path):
        raise UsageError(f"no run history at {path or '(off: WORKBENCH_STORE=off)'}; pass --store PATH")
    try:
        job = watched_job(args.job, store=path)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    print(json.dumps(job.to_dict(), indent=2) if args.json else job.describe())
    return 0


def _cmd_history(args: argparse.Namespace) -> int:
    from datetime import datetime

    from workbench.store import Store, default_store_path, store_exists
    from workbench.store.text import format_history
    from workbench.store.watched import watched_runs

    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    try:
        since = datetime.strptime(args.since, "%Y-%m-%d").timestamp() if args.since else None
    except ValueError:
        raise UsageError(f"--since must be a date YYYY-MM-DD, got '{args.since}'") from None
    config = config_from([args.config]) if args.config is not None else None
    path = args.store or default_store_path()
    if path is None:
        raise UsageError("the run history is off (WORKBENCH_STORE=off); pass --store PATH")
    if not store_exists(path):
        print("[]" if args.json else f"no runs stored yet (history: {path})")
        return 0
    with Store(path, create=False) as store:
        rows = store.history(workload=args.workload, config=config, commit=args.commit, since=since, limit=args.limit)
        if config is None:  # a watched job's settings are its own, not a TrainConfig to match
            watched = watched_runs(store, name=args.workload, commit=args.commit, since=since, limit=args.limit)
            rows = sorted([*rows, *(w.history_row() for w in watched)], key=_newest_first)[: args.limit]
    print(json.dumps([r.to_dict() for r in rows], indent=2) if args.json else format_history(rows, store.path))
    return 0
