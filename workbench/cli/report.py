"""`workbench report`: one standalone HTML file (no server, no internet) to attach to a pull request or
keep as a CI artifact: a stored comparison's verdicts, a workload's step time across commits, the
tuner's Pareto front, a watched job's ranks. Drawn by `wb.report` (`workbench.ui.report`); this only reads the flags."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workbench.cli.options import UsageError, add_store_arg


def add_commands(sub: Any) -> None:
    report = sub.add_parser("report", help="write one standalone HTML report (verdicts, history, Pareto front, ranks)")
    report.add_argument("--output", "-o", required=True, metavar="REPORT.html", help="the file to write")
    report.add_argument("--workload", default=None, help="its step time per commit, every stored configuration")
    report.add_argument(
        "--run",
        type=int,
        default=None,
        metavar="ID",
        help="a stored comparison run (`workbench history`): its verdicts",
    )
    report.add_argument(
        "--tune", default=None, metavar="TUNE.json", help="`workbench tune --json` output: its Pareto front"
    )
    report.add_argument("--job", default=None, help="a watched torchrun job (name or id): its ranks, the straggler")
    report.add_argument("--title", default="Training Workbench report")
    add_store_arg(report)
    report.set_defaults(handler=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from workbench.ui import write_report

    if args.workload is None and args.run is None and args.tune is None and args.job is None:
        raise UsageError("say what to report: --workload, --run, --tune and/or --job")
    try:
        path = write_report(
            args.output,
            store=args.store,
            workload=args.workload,
            run=args.run,
            tune=_tune_file(args.tune),
            ranks_of=_job(args),
            title=args.title,
        )
    except ValueError as exc:  # the report's own errors (ViewError) say what was wrong with the request
        raise UsageError(str(exc)) from None
    print(f"report written: {path}", file=sys.stderr)
    return 0


def _tune_file(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not the JSON of `workbench tune --json`: {exc}") from None


def _job(args: argparse.Namespace) -> Any:
    if args.job is None:
        return None
    from workbench.watch.job import watched_job

    try:
        return watched_job(args.job, store=args.store) if args.store else watched_job(args.job)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
