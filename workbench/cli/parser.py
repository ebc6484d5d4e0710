"""The command table: each family of commands adds its own subcommands, in the order `--help` lists them."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.cli import diagnose, diff, history, info, regress, report, trials, tune
from workbench.cli.options import EXIT_USAGE

_FAMILIES = (trials, info, diagnose, tune, diff, history, regress, report)
_VERBOSE_HELP = "show the full traceback of an error in your code (default: your file:line and the message)"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the valid choices (no usage dump)."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="workbench", description="Measure and compare PyTorch training-step optimizations.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for family in _FAMILIES:
        family.add_commands(sub)
    parser.add_argument("--verbose", "-v", action="store_true", help=_VERBOSE_HELP)
    for command in sub.choices.values():  # after the command too: `workbench run ... --verbose`
        command.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    return parser
