"""`workbench regress`: check a suite of configurations against stored results (for CI)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workbench.cli.options import (
    UsageError,
    add_device_arg,
    add_output_args,
    add_protocol_args,
    add_store_arg,
    protocol_from,
)


def add_commands(sub: Any) -> None:
    regress = sub.add_parser("regress", help="check a suite of configurations against stored results (for CI)")
    regress.add_argument("--suite", default=None, metavar="SUITE.json", help="workload, window and configurations")
    regress.add_argument("--watched", default=None, metavar="RUN",
                         help="check a watched job (wb.watch) instead of a suite: its run id or job name; "
                              "--against is then 'latest' (its newest earlier clean run on this hardware) or "
                              "'run:<id>'")  # fmt: skip
    regress.add_argument("--against", default="latest", metavar="REF",
                         help="'latest' (default), 'run:<id>' from `workbench history`, or a git commit/revision")  # fmt: skip
    regress.add_argument("--threshold", type=float, default=0.05,
                         help="fail when a slowdown's whole interval exceeds this fraction (default 0.05)")  # fmt: skip
    regress.add_argument("--repeats", type=int, default=None,
                         help="fewest trials of each configuration (default: the suite's, at least 4: an interval "
                              "over fewer trials cannot see between-process noise)")  # fmt: skip
    add_protocol_args(regress, budget_s=120.0, design=False)
    regress.add_argument("--from-store", action="store_true",
                         help="check the newest stored trials instead of measuring now")  # fmt: skip
    add_device_arg(regress)
    regress.add_argument("--timeout", type=float, default=None, metavar="S", help="as for `run`")
    add_store_arg(regress, saving=True)
    add_output_args(regress)
    regress.add_argument(
        "--report",
        default=None,
        metavar="REPORT.html",
        help="when the gate fails, also write a standalone HTML report: the table, the verdicts "
        "and the step time per commit with the regression marked (a CI artifact)",
    )
    regress.set_defaults(handler=_cmd_regress, runs_trials=True)


def _cmd_regress(args: argparse.Namespace) -> int:
    """Measure (or read) the suite, find each configuration's reference, gate on the report."""

    from workbench.analysis.intervals import MIN_UNITS
    from workbench.analysis.regress import Baseline, check_regressions, format_report, load_suite
    from workbench.store import default_store_path, opened_store, parse_reference, store_exists
    from workbench.store.reference import describe_trials, find_baselines, stored_current

    if (args.suite is None) == (args.watched is None):
        raise UsageError("give either --suite SUITE.json or --watched RUN")
    if args.watched is not None:
        return _regress_watched(args)
    suite = load_suite(args.suite)
    repeats = suite.repeats if args.repeats is None else args.repeats
    if repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {repeats}")
    repeats = max(repeats, MIN_UNITS)
    if not 0 <= args.threshold < 10:
        raise UsageError(f"--threshold must be a fraction such as 0.05 (5%), got {args.threshold}")
    saving = not args.no_store and not args.from_store
    path = args.store or default_store_path()
    if path is not None and not saving and not store_exists(path):
        path = None  # nothing stored yet, and nothing to save: no file is created
    if args.from_store and path is None:
        raise UsageError(f"--from-store reads the run history, but there is none ({args.store or 'WORKBENCH_STORE'})")
    with opened_store(path, create=saving) as store:
        reference = parse_reference(args.against, store)
        if args.from_store:
            assert store is not None
            stored = stored_current(suite, store)
            found = find_baselines(suite, reference, store, None, current=stored)
            current = {name: [t.result for t in trials] for name, trials in stored.items()}
        else:
            found, current = _measure(args, suite, reference, store if saving else None, store, repeats)
    baselines = {name: Baseline(describe_trials(t), [x.result for x in t]) if t else None for name, t in found.items()}
    report = check_regressions(suite, current, baselines, against=reference.describe(), threshold=args.threshold,
                               confidence=args.confidence)  # fmt: skip
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    _failure_report(args, report, store=path, workload=suite.workload)
    return report.exit_code


def _failure_report(args: argparse.Namespace, report: Any, store: Any = None, workload: str | None = None) -> None:
    """`--report`: the HTML report of a failed gate (nothing is written when it passes)."""
    if args.report is None or not report.regressed:
        return
    from workbench.ui import write_report

    try:
        path = write_report(
            args.report,
            regression=report,
            store=store,
            workload=workload if store else None,
            title=f"Regression check '{report.suite}' against {report.against}: FAILED",
        )
    except ValueError as exc:  # the report's own errors (ViewError) say what was wrong with the request
        raise UsageError(f"--report: {exc}") from None
    print(f"report written: {path}", file=sys.stderr)


def _regress_watched(args: argparse.Namespace) -> int:
    """A watched run's steady step time against a stored reference run (nothing is measured)."""
    from workbench.analysis.regress import format_report
    from workbench.store import Store, default_store_path
    from workbench.watch.regress import WatchReferenceError, check_watched_run

    path = args.store or default_store_path()
    if path is None:
        raise UsageError("--watched reads the run history, but it is off (WORKBENCH_STORE=off); pass --store PATH")
    try:
        with Store(path, create=False) as store:
            report = check_watched_run(store, args.watched, args.against, threshold=args.threshold,
                                       confidence=args.confidence)  # fmt: skip
    except WatchReferenceError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    _failure_report(args, report)
    return report.exit_code


def _measure(args: argparse.Namespace, suite: Any, reference: Any, saving_to: Any, store: Any, repeats: int) -> Any:
    """The references for `suite`, then its configurations measured now by the protocol's rounds until
    each row's interval against its reference is precise (or the budget ends)."""
    from workbench.analysis.intervals import MIN_UNITS
    from workbench.analysis.regress import Baseline, check_one
    from workbench.fingerprint import environment_fingerprint
    from workbench.progress import ProgressLine
    from workbench.protocol import run_rounds
    from workbench.store.reference import find_baselines

    # References first: the trials measured now are saved to this same store.
    found = find_baselines(suite, reference, store, environment_fingerprint(args.device))
    refs = [[x.result for x in found.get(c.name) or []] for c in suite.configurations]

    def widths(runs: list[list[Any]]) -> list[float | None]:
        """Each row's interval so far; 0 where more trials now cannot help (no or too small a reference)."""
        out: list[float | None] = []
        for item, ref, now in zip(suite.configurations, refs, runs):
            if sum(r.ok for r in ref) < MIN_UNITS:
                out.append(0.0)
                continue
            row = check_one(item.name, now, Baseline("", ref), args.threshold, args.confidence)
            out.append(row.half_width)
        return out

    protocol = protocol_from(args, min_rounds=repeats)
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        runs, _ = run_rounds(suite.workload, [c.config for c in suite.configurations], protocol, widths,
                             labels=[c.name for c in suite.configurations], kind="regress",
                             run_label=suite.name, store=saving_to, warmup=suite.warmup,
                             steps=suite.steps, device=args.device, preset=suite.preset, on_event=progress,
                             timeout_s=args.timeout)  # fmt: skip
    return found, {c.name: r for c, r in zip(suite.configurations, runs)}
