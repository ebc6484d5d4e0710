"""`workbench diff A B`: what changed between two stored, profiled trials, op by op.

A and B are run ids (`run_id` in `workbench history --json`; a run with one profiled trial) or
trial ids (the 12-character `trial_id`, or `trial:N` with the row id `history` shows as 'trial').
Input errors (unknown ids, no profiled window, different workloads) are one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from workbench.cli.options import UsageError, add_store_arg


class DiffInputError(Exception):
    """A bad A/B argument: printed as one line, exit code 2 (the CLI maps it to its input error)."""


def add_commands(sub: Any) -> None:
    diff = sub.add_parser("diff", help="per-op diff of two profiled runs: where the step-time change comes from")
    diff.add_argument("baseline", metavar="A", help="baseline: a run id, a trial id, or trial:N")
    diff.add_argument("candidate", metavar="B", help="candidate: a run id, a trial id, or trial:N")
    diff.add_argument("--top", type=int, default=15, help="rows to list (default 15)")
    add_store_arg(diff)
    diff.add_argument("--json", action="store_true", help="print JSON (rows, explained_share, ...)")
    diff.set_defaults(handler=_cmd_diff)


def _cmd_diff(args: argparse.Namespace) -> int:

    from workbench.analysis.trace_diff import TraceDiffError, diff_trials, format_diff
    from workbench.store import Store, default_store_path, store_exists

    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    path = args.store or default_store_path()
    if path is None:
        raise UsageError("the run history is off (WORKBENCH_STORE=off); pass --store PATH")
    if not store_exists(path):
        raise UsageError(f"no run history at {path}: run `workbench run --profile ...` twice first, or pass --store")
    try:
        with Store(path, create=False) as store:
            baseline, candidate = resolve_trial(store, args.baseline), resolve_trial(store, args.candidate)
        diff = diff_trials(baseline, candidate, top=args.top)
    except (DiffInputError, TraceDiffError) as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(diff.to_dict(), indent=2) if args.json else format_diff(diff))
    return 0


def resolve_trial(store: Any, ref: str) -> Any:
    """The stored TrialResult that `ref` names: a run id (its one profiled trial), a trial id, or trial:N."""
    text = ref.strip()
    if text.startswith("trial:"):
        row = text.removeprefix("trial:")
        if not row.isdigit():
            raise DiffInputError(f"'{ref}': trial:N takes the row id `workbench history` shows as 'trial'")
        return _get(store, int(row), ref)
    run = text.removeprefix("run:")
    if run.isdigit() and store.run(int(run)) is not None:
        trials = [t for t in store.trials(run_id=int(run)) if t.result.status == "ok"]
        profiled = [t for t in trials if t.result.profile]
        if len(profiled) == 1:
            return profiled[0].result
        if not profiled:
            which = trials[0].result.trial_id if trials else "none ok"
            raise DiffInputError(
                f"run {run} has no profiled window (trial {which}): rerun it with `workbench run --profile ...` "
                "and diff that run"
            )
        ids = ", ".join(t.result.trial_id for t in profiled)
        raise DiffInputError(f"run {run} has {len(profiled)} profiled trials ({ids}): pass one of those trial ids")
    return _get(store, text, ref)


def _get(store: Any, key: int | str, ref: str) -> Any:
    try:
        return store.get(key).result
    except KeyError:
        raise DiffInputError(
            f"no stored run or trial '{ref}' in {store.path}: see `workbench history --json` for run_id and trial_id"
        ) from None
