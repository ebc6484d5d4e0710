"""The options several commands share (the trial window, the run history, the comparison
protocol, `--set`) and the one reading of each into the API's arguments.

Defaults are read from the objects that own them (`TrialRequest` for the window, `Protocol`
for the comparison), so the help text, the app and the API cannot drift apart.
"""

from __future__ import annotations

import argparse
from typing import Any

from workbench.measure.arguments import (  # noqa: F401  (the commands import them from here)
    add_device_arg,
    add_set_arg,
    add_warmup_arg,
    add_window_args,
    add_workload_args,
    config_from,
)
from workbench.measure.request import TrialRequest
from workbench.protocol import Protocol

EXIT_FAILED_TRIAL = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def add_trial_args(
    p: argparse.ArgumentParser, steps: int = TrialRequest.steps, steps_help: str = "timed steps"
) -> None:
    """The trial window; its defaults are `TrialRequest`'s, the same as the API's and the app's."""
    add_window_args(p, steps, steps_help)
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="end a trial that makes no progress for S seconds once started (status 'timeout'); "
                        "the worker's start-up gets 60 s more")  # fmt: skip
    add_output_args(p)


def add_store_arg(p: argparse.ArgumentParser, saving: bool = False) -> None:
    p.add_argument(
        "--store",
        default=None,
        metavar="PATH|URL",
        help="run history: a file, or postgresql://USER@HOST[:PORT]/DATABASE for a team's shared history "
        "(default: $WORKBENCH_STORE, else a file in the user data dir)",
    )
    if saving:
        p.add_argument("--no-store", action="store_true", help="do not save the trials to the run history")


def store_arg(args: argparse.Namespace) -> Any:
    """The API's `store=` for these flags: None with --no-store, a path with --store, else the default."""
    from workbench.store import DEFAULT_STORE

    if getattr(args, "no_store", False):
        return None
    return args.store or DEFAULT_STORE


def add_protocol_args(p: argparse.ArgumentParser, budget_s: float = Protocol.budget_s, design: bool = True) -> None:
    """The comparison protocol's controls (`workbench.protocol.Protocol`), with its defaults."""
    add_precision_arg(p, help=f"stop when every speedup interval is within ±F (default {Protocol.precision:g} = "
                              f"±{Protocol.precision * 100:g}%%)")  # fmt: skip
    p.add_argument("--budget", type=float, default=budget_s, metavar="S",
                   help=f"seconds the comparison may take before it stops adding rounds (default {budget_s:g})")  # fmt: skip
    if design:  # regress always measures fresh processes: its other side is stored
        p.add_argument("--design", default=Protocol.design, choices=("auto", "paired", "processes"),
                       help="auto: paired rounds where honest, else one fresh process per unit")  # fmt: skip
        p.add_argument("--paired-workers", type=int, default=None, metavar="N",
                       help="paired design: workers the rounds rotate between, so no one worker's bias decides "
                            f"(default {Protocol.paired_workers}; 1 saves a worker's memory)")  # fmt: skip
    p.add_argument("--confidence", type=float, default=Protocol.confidence,
                   help=f"interval confidence (default {Protocol.confidence:g})")  # fmt: skip


def add_precision_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--precision", type=float, default=Protocol.precision, metavar="F", help=help)


def protocol_from(args: argparse.Namespace, **fixed: Any) -> Protocol:
    """The `Protocol` these flags ask for; `fixed` sets what the command decides itself."""
    if getattr(args, "paired_workers", None) is not None:
        fixed = {"paired_workers": args.paired_workers, **fixed}
    return Protocol(precision=args.precision, budget_s=args.budget, design=getattr(args, "design", "processes"),
                    confidence=args.confidence, **fixed)  # fmt: skip
