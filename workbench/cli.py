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
    stdout = sys.stdout
    sys.stdout = _ReaderMayLeave(stdout)  # type: ignore[assignment]
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


class _ReaderMayLeave:
    """stdout for `workbench ... | head`: when the reader leaves, the rest of the output is dropped
    and the command still exits with its own code (a failed trial stays exit 1, not 0)."""

    def __init__(self, stream: Any) -> None:
        self._stream, self._gone = stream, False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        import os

        self._gone = True
        # Python flushes stdout once more at exit: point the descriptor at /dev/null so that
        # flush cannot fail again (the way the `signal` module's documentation advises).
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (a test's capture): nothing to protect
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="Measure and compare PyTorch training-step optimizations.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="measure one configuration")
    _add_trial_args(run)
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V[,K=V]",
                     help="config fields to change, e.g. --set amp=bf16 --set compile=default")  # fmt: skip
    run.add_argument("--profile", action="store_true",
                     help="add a profiled window after the timed one and print the diagnosis")  # fmt: skip
    _add_store_arg(run, saving=True)
    run.set_defaults(handler=_cmd_run)

    compare = sub.add_parser("compare", help="compare candidates against a baseline (calibrated, adaptive)")
    _add_trial_args(compare, steps=10, steps_help="timed steps of each configuration's fresh characterizing trial")
    compare.add_argument(
        "--baseline", default="", metavar="K=V[,K=V]", help="baseline config overrides (default: defaults)"
    )
    compare.add_argument("--candidate", action="append", default=[], metavar="K=V[,K=V]", required=True,
                         help="a candidate's overrides on top of the baseline; repeat for more")  # fmt: skip
    _add_protocol_args(compare)
    _add_store_arg(compare, saving=True)
    compare.set_defaults(handler=_cmd_compare)

    export = sub.add_parser("export", help="write a configuration as a Python snippet, JSON or a command line")
    export.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V[,K=V]")
    export.add_argument("--format", default="snippet", choices=("snippet", "json", "command"))
    export.add_argument("--device", default="cuda", help="device the snippet targets (default cuda)")
    export.add_argument("--workload", default="bev-perception", help="for --format command")
    export.add_argument("--preset", default="tiny", choices=PRESETS, help="for --format command")
    export.add_argument("--nvtx", action="store_true",
                        help="snippet: wrap each step and phase in NVTX ranges (Nsight Systems shows them)")  # fmt: skip
    export.set_defaults(handler=_cmd_export)

    workloads = sub.add_parser("workloads", help="list built-in workloads")
    workloads.add_argument("--json", action="store_true")
    workloads.set_defaults(handler=_cmd_workloads)

    caps = sub.add_parser("capabilities", help="what this device supports, with reasons")
    caps.add_argument("--device", default=None)
    caps.add_argument("--json", action="store_true")
    caps.set_defaults(handler=_cmd_capabilities)

    from workbench.cli_diagnose import add_commands  # diagnose, estimate

    add_commands(sub, _add_trial_args, _config)
    from workbench.cli_tune import add_command as add_tune

    add_tune(sub, _add_store_arg, _store_arg)
    from workbench.cli_diff import add_command as add_diff

    add_diff(sub, _add_store_arg)

    history = sub.add_parser("history", help="stored trials, newest first")
    history.add_argument("--workload", default=None, help="only this workload")
    history.add_argument("--config", default=None, metavar="K=V[,K=V]",
                         help="only this exact configuration ('' for the defaults)")  # fmt: skip
    history.add_argument("--commit", default=None, help="only trials at this git commit (sha or prefix)")
    history.add_argument("--since", default=None, metavar="YYYY-MM-DD", help="only trials started on or after")
    history.add_argument("--limit", type=int, default=20, help="most rows to show (default 20)")
    _add_store_arg(history)
    history.add_argument("--json", action="store_true")
    history.set_defaults(handler=_cmd_history)

    regress = sub.add_parser("regress", help="check a suite of configurations against stored results (for CI)")
    regress.add_argument("--suite", required=True, metavar="SUITE.json", help="workload, window and configurations")
    regress.add_argument("--against", default="latest", metavar="REF",
                         help="'latest' (default), 'run:<id>' from `workbench history`, or a git commit/revision")  # fmt: skip
    regress.add_argument("--threshold", type=float, default=0.05,
                         help="fail when a slowdown's whole interval exceeds this fraction (default 0.05)")  # fmt: skip
    regress.add_argument("--repeats", type=int, default=None,
                         help="fewest trials of each configuration (default: the suite's, at least 4: an interval "
                              "over fewer trials cannot see between-process noise)")  # fmt: skip
    _add_protocol_args(regress, budget_s=120.0, design=False)
    regress.add_argument("--from-store", action="store_true",
                         help="check the newest stored trials instead of measuring now")  # fmt: skip
    regress.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")
    regress.add_argument("--timeout", type=float, default=None, metavar="S", help="as for `run`")
    _add_store_arg(regress, saving=True)
    regress.add_argument("--json", action="store_true", help="print JSON instead of a table")
    regress.add_argument("--quiet", action="store_true", help="no progress line")
    regress.set_defaults(handler=_cmd_regress)
    verbose_help = "show the full traceback of an error in your code (default: your file:line and the message)"
    parser.add_argument("--verbose", "-v", action="store_true", help=verbose_help)
    for command in sub.choices.values():  # after the command too: `workbench run ... --verbose`
        command.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    return parser


def _add_store_arg(p: argparse.ArgumentParser, saving: bool = False) -> None:
    p.add_argument("--store", default=None, metavar="PATH",
                   help="run history file (default: $WORKBENCH_STORE, else the user data dir)")  # fmt: skip
    if saving:
        p.add_argument("--no-store", action="store_true", help="do not save the trials to the run history")


def _store_arg(args: argparse.Namespace) -> Any:
    """The API's `store=` for these flags: None with --no-store, a path with --store, else the default."""
    from workbench.store import DEFAULT_STORE

    if getattr(args, "no_store", False):
        return None
    return args.store or DEFAULT_STORE


def _add_protocol_args(p: argparse.ArgumentParser, budget_s: float = 60.0, design: bool = True) -> None:
    """The comparison protocol's controls (`workbench.protocol.Protocol`)."""
    p.add_argument("--precision", type=float, default=0.03, metavar="F",
                   help="stop when every speedup interval is within ±F (default 0.03 = ±3%%)")  # fmt: skip
    p.add_argument("--budget", type=float, default=budget_s, metavar="S",
                   help=f"seconds the comparison may take before it stops adding rounds (default {budget_s:g})")  # fmt: skip
    if design:  # regress always measures fresh processes: its other side is stored
        p.add_argument("--design", default="auto", choices=("auto", "paired", "processes"),
                       help="auto: paired rounds where honest, else one fresh process per unit")  # fmt: skip
        p.add_argument("--paired-workers", type=int, default=None, metavar="N",
                       help="paired design: workers the rounds rotate between, so no one worker's bias decides "
                            "(default 2; 1 saves a worker's memory)")  # fmt: skip
    p.add_argument("--confidence", type=float, default=0.95, help="interval confidence (default 0.95)")


def _protocol(args: argparse.Namespace, **fixed: Any) -> Any:
    from workbench.protocol import Protocol

    if getattr(args, "paired_workers", None) is not None:
        fixed = {"paired_workers": args.paired_workers, **fixed}
    return Protocol(precision=args.precision, budget_s=args.budget, design=getattr(args, "design", "processes"),
                    confidence=args.confidence, **fixed)  # fmt: skip


def _add_trial_args(p: argparse.ArgumentParser, steps: int = 20, steps_help: str = "timed steps") -> None:
    p.add_argument("--workload", default="bev-perception", help="built-in name or package.module:function")
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--steps", type=int, default=steps, help=f"{steps_help} (default {steps})")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="end a trial that makes no progress for S seconds once started (status 'timeout'); "
                        "the worker's start-up gets 60 s more")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def _config(overrides: Sequence[str], base: TrainConfig | None = None) -> TrainConfig:
    """Every --set at once, validated together: `--set prefetch_factor=4 --set num_workers=2` is one
    valid configuration, whatever the order (later flags win for the same field)."""
    from workbench.config import parse_overrides

    config = base or TrainConfig()
    changes: dict[str, Any] = {}
    for text in overrides:
        parsed = parse_overrides(text)
        extra = {**changes.get("extra", {}), **parsed.pop("extra", {})}
        changes.update(parsed)
        if extra:
            changes["extra"] = extra
    if "extra" in changes:
        changes["extra"] = {**config.extra, **changes["extra"]}
    return config.replace(**changes)


# --- commands -----------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    from workbench.api import run_and_store
    from workbench.progress import ProgressLine

    config = _config(args.overrides)
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        result = run_and_store(args.workload, config, warmup=args.warmup, steps=args.steps, device=args.device,
                               preset=args.preset, on_event=progress, timeout_s=args.timeout,
                               store=_store_arg(args), profile=args.profile)  # fmt: skip
    if args.json:
        print(result.to_json(indent=2))
    else:
        from workbench.report import run_summary

        print(run_summary(result, verbose=getattr(args, "verbose", False)))
        if args.profile:
            from workbench.analysis.diagnose import diagnose_trial

            print("\n" + diagnose_trial(result).to_text(result))
    return 0 if result.ok else EXIT_FAILED_TRIAL


def _cmd_compare(args: argparse.Namespace) -> int:
    from workbench.api import run_comparison
    from workbench.progress import ProgressLine

    baseline = _config([args.baseline])
    candidates = [_config([text], base=baseline) for text in args.candidate]
    protocol = _protocol(args)
    _check_on_device([baseline, *candidates], args.device, ["baseline", *(f"candidate '{c}'" for c in args.candidate)])
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        outcome = run_comparison(args.workload, baseline, candidates, protocol=protocol, warmup=args.warmup,
                                 steps=args.steps, device=args.device, preset=args.preset, on_event=progress,
                                 timeout_s=args.timeout, store=_store_arg(args))  # fmt: skip
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        from workbench.report import comparison_table

        print(comparison_table(outcome))
    failed = [c for c in outcome.comparison.candidates if c.summary.status != "ok"]
    return EXIT_FAILED_TRIAL if failed or outcome.comparison.baseline.status != "ok" else 0


def _check_on_device(configs: Sequence[TrainConfig], device: str | None, labels: Sequence[str]) -> None:
    """Refuse any configuration this device cannot run before the first trial measures (and stores) anything."""
    from workbench.device import check_config, resolve_device

    dev = resolve_device(device)
    for config, label in zip(configs, labels):
        try:
            check_config(config, dev)
        except ConfigError as exc:
            raise ConfigError(f"{label}: {exc}") from None


def _cmd_export(args: argparse.Namespace) -> int:
    from workbench.export import export_config

    config = _config(args.overrides)
    if args.nvtx and args.format != "snippet":
        raise UsageError(f"--nvtx marks the snippet's steps; it does not apply to --format {args.format}")
    if args.format == "snippet":
        print(export_config(config, "snippet", device=args.device, nvtx=args.nvtx))
    elif args.format == "command":
        from workbench.workloads import load_workload

        load_workload(args.workload, preset=args.preset, **config.extra)  # a command that cannot run is no export
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


def _cmd_history(args: argparse.Namespace) -> int:
    from datetime import datetime
    from pathlib import Path

    from workbench.store import Store, default_store_path
    from workbench.store.text import format_history

    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    try:
        since = datetime.strptime(args.since, "%Y-%m-%d").timestamp() if args.since else None
    except ValueError:
        raise UsageError(f"--since must be a date YYYY-MM-DD, got '{args.since}'") from None
    config = _config([args.config]) if args.config is not None else None
    path = args.store or default_store_path()
    if path is None:
        raise UsageError("the run history is off (WORKBENCH_STORE=off); pass --store PATH")
    if not Path(path).exists():
        print("[]" if args.json else f"no runs stored yet (history: {path})")
        return 0
    with Store(path, create=False) as store:
        rows = store.history(workload=args.workload, config=config, commit=args.commit, since=since, limit=args.limit)
    print(json.dumps([r.to_dict() for r in rows], indent=2) if args.json else format_history(rows, store.path))
    return 0


def _cmd_regress(args: argparse.Namespace) -> int:
    """Measure (or read) the suite, find each configuration's reference, gate on the report."""
    from pathlib import Path

    from workbench.analysis.intervals import MIN_UNITS
    from workbench.analysis.regress import Baseline, check_one, check_regressions, format_report, load_suite
    from workbench.store import default_store_path, opened_store, parse_reference
    from workbench.store.reference import describe_trials, find_baselines, stored_current

    suite = load_suite(args.suite)
    if not args.from_store:
        _check_on_device([c.config for c in suite.configurations], args.device, [c.name for c in suite.configurations])
    repeats = suite.repeats if args.repeats is None else args.repeats
    if repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {repeats}")
    repeats = max(repeats, MIN_UNITS)
    if not 0 <= args.threshold < 10:
        raise UsageError(f"--threshold must be a fraction such as 0.05 (5%), got {args.threshold}")
    saving = not args.no_store and not args.from_store
    path = args.store or default_store_path()
    if path is not None and not saving and not Path(path).exists():
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
            from workbench.fingerprint import environment_fingerprint
            from workbench.progress import ProgressLine
            from workbench.protocol import run_rounds

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

            protocol = _protocol(args, min_rounds=repeats)
            with ProgressLine(enabled=not args.quiet and not args.json) as progress:
                runs, _ = run_rounds(suite.workload, [c.config for c in suite.configurations], protocol, widths,
                                     labels=[c.name for c in suite.configurations], kind="regress",
                                     run_label=suite.name, store=store if saving else None, warmup=suite.warmup,
                                     steps=suite.steps, device=args.device, preset=suite.preset, on_event=progress,
                                     timeout_s=args.timeout)  # fmt: skip
            current = {c.name: r for c, r in zip(suite.configurations, runs)}
    baselines = {name: Baseline(describe_trials(t), [x.result for x in t]) if t else None for name, t in found.items()}
    report = check_regressions(suite, current, baselines, against=reference.describe(), threshold=args.threshold,
                               confidence=args.confidence)  # fmt: skip
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
