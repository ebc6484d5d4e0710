"""`workbench run` and `workbench compare`: measure one configuration, or compare candidates with a baseline."""

from __future__ import annotations

import argparse
import json
from typing import Any

from workbench.cli.options import (
    EXIT_FAILED_TRIAL,
    UsageError,
    add_protocol_args,
    add_set_arg,
    add_store_arg,
    add_trial_args,
    config_from,
    protocol_from,
    store_arg,
)


def add_commands(sub: Any) -> None:
    run = sub.add_parser("run", help="measure one configuration")
    add_trial_args(run)
    add_set_arg(run, help="config fields to change, e.g. --set amp=bf16 --set compile=default")
    run.add_argument("--profile", action="store_true",
                     help="add a profiled window after the timed one and print the diagnosis")  # fmt: skip
    run.add_argument(
        "--data-stages",
        action="store_true",
        help="time each sample's stages (read, decode, ...) where the loader prepares it, and each copy to the device",
    )
    add_store_arg(run, saving=True)
    run.set_defaults(handler=_cmd_run, runs_trials=True)

    compare = sub.add_parser("compare", help="compare candidates against a baseline (calibrated, adaptive)")
    add_trial_args(compare, steps_help="timed steps of each configuration's fresh characterizing trial")
    compare.add_argument(
        "--baseline", default="", metavar="K=V[,K=V]", help="baseline config overrides (default: defaults)"
    )
    compare.add_argument(
        "--candidate",
        action="append",
        default=[],
        metavar="K=V[,K=V]",
        help="a candidate's overrides on top of the baseline; repeat for more",
    )
    compare.add_argument(
        "--ideal-loader",
        action="store_true",
        help="add a row: the baseline's step on a few real batches staged on the device (no loader), "
        "and print what the data pipeline costs the step",
    )
    add_protocol_args(compare)
    add_store_arg(compare, saving=True)
    compare.set_defaults(handler=_cmd_compare, runs_trials=True)

    workers = sub.add_parser("workers", help="the smallest num_workers at which the loader stops being the bound")
    add_trial_args(workers)
    add_set_arg(workers, help="the config to size the loader for, e.g. --set extra.camera_files=true")
    add_store_arg(workers, saving=True)
    workers.set_defaults(handler=_cmd_workers, runs_trials=True)


def _cmd_run(args: argparse.Namespace) -> int:
    from workbench.api import run_and_store
    from workbench.progress import ProgressLine

    config = config_from(args.overrides)
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        result = run_and_store(
            args.workload,
            config,
            warmup=args.warmup,
            steps=args.steps,
            device=args.device,
            preset=args.preset,
            on_event=progress,
            timeout_s=args.timeout,
            store=store_arg(args),
            profile=args.profile,
            data_stages=args.data_stages,
        )
    if args.json:
        print(result.to_json(indent=2))
    else:
        from workbench.terminal import run_summary

        print(run_summary(result, verbose=getattr(args, "verbose", False)))
        if result.data_stages is not None:
            from workbench.measure.data_stages import stages_text

            print("\n" + stages_text(result.data_stages))
        if args.profile:
            from workbench.analysis.diagnose import diagnose_trial

            print("\n" + diagnose_trial(result).to_text(result))
    return 0 if result.ok else EXIT_FAILED_TRIAL


def _cmd_workers(args: argparse.Namespace) -> int:
    from workbench.api import workers_enough
    from workbench.progress import ProgressLine

    config = config_from(args.overrides)
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        scaling = workers_enough(
            args.workload,
            config,
            warmup=args.warmup,
            steps=args.steps,
            device=args.device,
            preset=args.preset,
            on_event=progress,
            timeout_s=args.timeout,
            store=store_arg(args),
        )
    if args.json:
        print(json.dumps(scaling.to_dict(), indent=2))
        return 0
    one = scaling.steps_ms.get(1)
    for count, step_ms in sorted(scaling.steps_ms.items()):
        ratio = f"  {one / step_ms:.2f}x one worker's speed" if one else ""
        print(f"num_workers={count}: {step_ms:8.1f} ms/step{ratio}")
    print(f"ideal loader (batches staged on the device): {scaling.ideal_step_ms:.1f} ms/step")
    stopped = scaling.stopped_paying()
    if stopped is not None:
        print(f"adding workers stopped paying at num_workers={stopped} (less than 10% faster than the count before)")
    print(scaling.sentence())
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from workbench.api import run_comparison
    from workbench.progress import ProgressLine

    if not args.candidate and not args.ideal_loader:
        raise UsageError(
            "compare needs a --candidate (repeat for more), or --ideal-loader for the data pipeline's bound"
        )
    baseline = config_from([args.baseline])
    candidates = [config_from([text], base=baseline) for text in args.candidate]
    protocol = protocol_from(args)
    # The protocol checks every configuration before it measures anything; labelled with the
    # candidate's own --candidate text, a refusal names the flag to fix (and so does the history).
    labels = ["baseline", *(f"candidate '{c}'" for c in args.candidate)]
    with ProgressLine(enabled=not args.quiet and not args.json) as progress:
        outcome = run_comparison(
            args.workload,
            baseline,
            candidates,
            protocol=protocol,
            labels=labels,
            warmup=args.warmup,
            steps=args.steps,
            device=args.device,
            preset=args.preset,
            on_event=progress,
            timeout_s=args.timeout,
            store=store_arg(args),
            ideal_loader=args.ideal_loader,
        )
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        from workbench.terminal import comparison_table

        print(comparison_table(outcome))
    failed = [c for c in outcome.comparison.candidates if c.summary.status != "ok"]
    return EXIT_FAILED_TRIAL if failed or outcome.comparison.baseline.status != "ok" else 0
