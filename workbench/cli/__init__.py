"""`workbench` command line: the same public API as the notebook app, headless.

Every input error (bad flag, unknown field or workload) is one line on stderr and
exit code 2; a trial that fails is reported in its row and exits 1. One module per
family of commands; `options` holds the flags they share, `parser` the command table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from workbench.cli.options import EXIT_USAGE, UsageError
from workbench.cli.output import ReaderMayLeave
from workbench.cli.parser import build_parser
from workbench.config import ConfigError
from workbench.measure.forkserver import start_server
from workbench.workloads.base import WorkloadError

__all__ = ["UsageError", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # as given: `tune --workers` reruns it
    if getattr(args, "runs_trials", False):
        start_server()  # its imports overlap ours: the first trial's worker is then a fork away
    stdout = sys.stdout
    sys.stdout = ReaderMayLeave(stdout)  # type: ignore[assignment]
    try:
        return int(args.handler(args))
    except (ConfigError, WorkloadError, UsageError) as exc:
        return _input_error(args, exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from workbench.store import StoreError  # imported only when needed: keeps start-up lean

        if not isinstance(exc, StoreError):
            raise
        return _input_error(args, exc)
    finally:
        sys.stdout.flush()
        sys.stdout = stdout


def _input_error(args: argparse.Namespace, exc: Exception) -> int:
    """One line naming the problem; under --verbose, the traceback of the user's code that caused it."""
    cause = exc.__cause__
    more = " (--verbose shows the traceback)" if cause is not None and not getattr(args, "verbose", False) else ""
    print(f"workbench {args.command}: error: {exc}{more}", file=sys.stderr)
    if cause is not None and getattr(args, "verbose", False):
        import traceback

        print("".join(traceback.format_exception(cause)).rstrip(), file=sys.stderr)
    return EXIT_USAGE
