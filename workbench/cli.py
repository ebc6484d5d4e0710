"""`workbench` command line: the same public API as the notebook app, headless.

Every input error (bad flag, unknown field or workload) is one line on stderr and
exit code 2; a trial that fails is reported in its row and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.workloads.base import WorkloadError
from workbench.workloads.registry import PRESETS

EXIT_FAILED_TRIAL = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the valid choices (no usage dump)."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ConfigError, WorkloadError, UsageError) as exc:
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `workbench export | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="Measure and compare PyTorch training-step optimizations.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="measure one configuration")
    _add_trial_args(run)
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V[,K=V]",
                     help="config fields to change, e.g. --set amp=bf16 --set compile=default")  # fmt: skip
    run.set_defaults(handler=_cmd_run)

    compare = sub.add_parser("compare", help="compare candidates against a baseline")
    _add_trial_args(compare)
    compare.add_argument(
        "--baseline", default="", metavar="K=V[,K=V]", help="baseline config overrides (default: defaults)"
    )
    compare.add_argument("--candidate", action="append", default=[], metavar="K=V[,K=V]", required=True,
                         help="a candidate's overrides on top of the baseline; repeat for more")  # fmt: skip
    compare.add_argument("--repeats", type=int, default=1, help="interleaved repeats per configuration (default 1)")
    compare.set_defaults(handler=_cmd_compare)

    export = sub.add_parser("export", help="write a configuration as a Python snippet, JSON or a command line")
    export.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V[,K=V]")
    export.add_argument("--format", default="snippet", choices=("snippet", "json", "command"))
    export.add_argument("--device", default="cuda", help="device the snippet targets (default cuda)")
    export.add_argument("--workload", default="bev-perception", help="for --format command")
    export.add_argument("--preset", default="tiny", choices=PRESETS, help="for --format command")
    export.set_defaults(handler=_cmd_export)

    workloads = sub.add_parser("workloads", help="list built-in workloads")
    workloads.add_argument("--json", action="store_true")
    workloads.set_defaults(handler=_cmd_workloads)

    caps = sub.add_parser("capabilities", help="what this device supports, with reasons")
    caps.add_argument("--device", default=None)
    caps.add_argument("--json", action="store_true")
    caps.set_defaults(handler=_cmd_capabilities)
    return parser


def _add_trial_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="bev-perception", help="built-in name or package.module:function")
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="end a trial that makes no progress for S seconds (status 'timeout')")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def _config(overrides: Sequence[str], base: TrainConfig | None = None) -> TrainConfig:
    config = base or TrainConfig()
    for text in overrides:
        config = config.with_overrides(text)
    return config


# --- commands -----------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    from workbench.measure import run_trial
    from workbench.progress import ProgressLine

    config = _config(args.overrides)
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        result = run_trial(args.workload, config, warmup=args.warmup, steps=args.steps, device=args.device,
                           preset=args.preset, on_event=progress, timeout_s=args.timeout)  # fmt: skip
    if args.json:
        print(result.to_json(indent=2))
    else:
        from workbench.report import run_summary

        print(run_summary(result))
    return 0 if result.ok else EXIT_FAILED_TRIAL


def _cmd_compare(args: argparse.Namespace) -> int:
    from workbench.api import run_comparison
    from workbench.progress import ProgressLine

    baseline = _config([args.baseline])
    candidates = [_config([text], base=baseline) for text in args.candidate]
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        outcome = run_comparison(args.workload, baseline, candidates, repeats=args.repeats, warmup=args.warmup,
                                 steps=args.steps, device=args.device, preset=args.preset, on_event=progress,
                                 timeout_s=args.timeout)  # fmt: skip
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        from workbench.report import comparison_table

        print(comparison_table(outcome))
    failed = [c for c in outcome.comparison.candidates if c.summary.status != "ok"]
    return EXIT_FAILED_TRIAL if failed or outcome.comparison.baseline.status != "ok" else 0


def _cmd_export(args: argparse.Namespace) -> int:
    from workbench.export import export_config

    config = _config(args.overrides)
    if args.format == "snippet":
        print(export_config(config, "snippet", device=args.device))
    elif args.format == "command":
        print(export_config(config, "command", workload=args.workload, preset=args.preset))
    else:
        print(export_config(config, "json"))
    return 0


def _cmd_workloads(args: argparse.Namespace) -> int:
    from workbench.textfmt import table
    from workbench.workloads import builtin_workloads

    items = builtin_workloads()
    if args.json:
        print(
            json.dumps(
                [{"name": w.name, "description": w.description, "presets": list(PRESETS)} for w in items.values()],
                indent=2,
            )
        )
        return 0
    print(
        table(
            ["workload", "presets", "description"], [[w.name, "/".join(PRESETS), w.description] for w in items.values()]
        )
    )
    print("\nYour own: --workload package.module:function (returning a workbench Workload).")
    return 0


def _cmd_capabilities(args: argparse.Namespace) -> int:
    from workbench.device import capabilities_report

    report = capabilities_report(args.device)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from workbench.textfmt import format_bytes, table

    dev = report["device"]
    print(
        f"{dev['type']}: {dev['name']} (x{dev['count']}, {dev['cpu_cores']} CPU cores, memory {format_bytes(dev['total_memory_bytes'])})"
    )
    rows: list[list[Any]] = []
    for name, values in report["toggles"].items():
        for value, availability in values.items():
            mark = "yes" if availability["available"] else "NO"
            rows.append([f"{name}={value}", mark, availability["reason"]])
    print(table(["toggle", "available", "reason / note"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
