"""`workbench diagnose` and `workbench estimate`: why a step is slow, and what memory a config needs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from workbench.cli.options import EXIT_FAILED_TRIAL, add_set_arg, add_trial_args, add_workload_args, config_from
from workbench.config import ConfigError
from workbench.textfmt import parse_bytes

DIAGNOSE_STEPS = 8
"""Timed steps before the profiled window: a diagnosis needs the profile more than a long window."""


def add_commands(sub: Any) -> None:
    diagnose = sub.add_parser("diagnose", help="run a profiled trial and say why the step is slow")
    add_trial_args(diagnose, steps=DIAGNOSE_STEPS)
    add_set_arg(diagnose)
    diagnose.add_argument("--trace-dir", default=None, help="where the gzip profiler trace goes (default: tmp)")
    diagnose.add_argument(
        "--planned-steps",
        type=int,
        default=None,
        metavar="N",
        help="a compiled config: also run it uncompiled and judge whether the compile pays back "
        "within N steps of your real run",
    )
    diagnose.set_defaults(handler=_cmd_diagnose, runs_trials=True)

    estimate = sub.add_parser("estimate", help="peak memory of a config on a GPU, and the largest batch that fits")
    add_workload_args(estimate)
    add_set_arg(estimate)
    estimate.add_argument("--device-name", default="H100", help="'cpu' or a GPU in the peak table (H100, H200, A100 80GB, ...)")  # fmt: skip
    estimate.add_argument("--batch-size", type=int, default=None, help="estimate at this micro-batch size")
    estimate.add_argument("--max-batch-size", action="store_true", help="search the largest batch that fits")
    estimate.add_argument("--memory-budget", default=None, metavar="BYTES",
                          help="budget for --max-batch-size, e.g. 80GB or 75GiB (default: 90%% of the device)")  # fmt: skip
    estimate.add_argument("--json", action="store_true")
    estimate.set_defaults(handler=_cmd_estimate)


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from workbench.analysis.compare import DEFAULT_PLANNED_STEPS
    from workbench.analysis.diagnose import diagnose_trial
    from workbench.measure.profile import ProfileOptions
    from workbench.progress import ProgressLine
    from workbench.trials import run_trial

    config = config_from(args.overrides)
    planned = _planned_steps(args.planned_steps, config)
    options = ProfileOptions(trace_dir=args.trace_dir)
    baseline = None
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        result = run_trial(args.workload, config, warmup=args.warmup, steps=args.steps, device=args.device,
                           preset=args.preset, on_event=progress, timeout_s=args.timeout, profile=options)  # fmt: skip
        if planned is not None and result.ok:
            baseline = run_trial(
                args.workload,
                config.replace(compile="off"),
                warmup=args.warmup,
                steps=args.steps,
                device=args.device,
                preset=args.preset,
                on_event=progress,
                timeout_s=args.timeout,
            )
    diagnosis = diagnose_trial(result, baseline=baseline, planned_steps=planned or DEFAULT_PLANNED_STEPS)
    if args.json:
        print(json.dumps({"result": result.to_dict(), "diagnosis": diagnosis.to_dict()}, indent=2, default=str))
    else:
        from workbench.terminal import run_summary

        print(run_summary(result, verbose=getattr(args, "verbose", False)))
        print()
        print(diagnosis.to_text(result))
    return 0 if result.ok else EXIT_FAILED_TRIAL


def _planned_steps(value: int | None, config: Any) -> int | None:
    """--planned-steps asks for an uncompiled baseline run: only a compiled config has a compile to pay back."""
    if value is None:
        return None
    if value < 1:
        raise ConfigError(f"--planned-steps must be a whole number of steps >= 1, got {value}")
    if config.compile == "off":
        raise ConfigError("--planned-steps judges a compile's payback: add --set compile=default (or another mode)")
    return value


def _cmd_estimate(args: argparse.Namespace) -> int:
    from workbench.estimate import estimate_memory, max_batch_size

    config = config_from(args.overrides)
    budget = parse_bytes(args.memory_budget) if args.memory_budget else None
    if budget is not None and not args.max_batch_size:
        raise ConfigError("--memory-budget is the budget of --max-batch-size; add --max-batch-size")
    _check_device_name(args.device_name, budget)
    if args.max_batch_size:
        search = max_batch_size(args.workload, config, args.device_name, budget, preset=args.preset)
        print(json.dumps(search.to_dict(), indent=2) if args.json else search.to_text())
        return 0
    estimate = estimate_memory(args.workload, config, args.device_name, args.batch_size, preset=args.preset)
    print(json.dumps(estimate.to_dict(), indent=2) if args.json else estimate.to_text())
    return 0


def _check_device_name(name: str, budget: int | None) -> None:
    """A GPU the peak table does not know has no memory size or allocator figures to estimate with:
    say so (a typo such as 'H1OO' must not become an estimate for an 'unknown' GPU)."""
    from workbench.peak_specs import known_devices, lookup_spec

    if name.strip().lower() == "cpu" or lookup_spec(name) is not None or budget is not None:
        return
    raise ConfigError(
        f"unknown device '{name}' for --device-name (not in the peak table); known: cpu, {', '.join(known_devices())} "
        "(or give --max-batch-size a --memory-budget for another GPU)"
    )
