"""`workbench tune`: the auto-tuner on the command line (`workbench.tune.tune`).

Same conventions as the other commands: bad input is one line and exit 2 (before any trial
where it can be known), `--json` prints the result as plain data, a search whose baseline
fails exits 1. A trial's crash is a row of the result, never the end of the search.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workbench.cli.options import (
    EXIT_FAILED_TRIAL,
    UsageError,
    add_device_arg,
    add_precision_arg,
    add_set_arg,
    add_store_arg,
    add_warmup_arg,
    add_workload_args,
    config_from,
    store_arg,
)
from workbench.textfmt import parse_bytes, parse_duration


def add_commands(sub: Any) -> None:
    tune = sub.add_parser("tune", help="search the levers for the fastest configuration that fits, then verify it")
    add_workload_args(tune)
    tune.add_argument("--budget", default="10m", help="wall-clock time for the whole search: 600, 90s, 10m, 1h")
    tune.add_argument("--max-memory", default=None, metavar="SIZE", help="peak memory limit, e.g. 20GiB or 80GB")
    tune.add_argument("--objective", default="auto", choices=("auto", "step-time", "throughput"),
                      help="auto: throughput (per sample) when batch sizes vary, else step time")  # fmt: skip
    tune.add_argument("--planned-steps", type=int, default=None, metavar="N",
                      help="steps of your real run: compile time is spread over them (default 10000)")  # fmt: skip
    tune.add_argument("--space", default=None, metavar="FILE",
                      help='JSON object of field -> list of values, e.g. {"amp": ["fp32", "bf16"]} (default: every lever this device runs)')  # fmt: skip
    tune.add_argument("--global-batch", type=int, default=None, metavar="N",
                      help="keep batch_size x grad_accumulation at N (gradient accumulation follows the batch size)")  # fmt: skip
    add_set_arg(tune, help="baseline config fields (default: PyTorch defaults)")
    add_precision_arg(tune, help="the protocol's precision (±F)")
    tune.add_argument("--steps", type=int, default=10, help="timed steps of each screening trial (default 10)")
    add_warmup_arg(tune)
    add_device_arg(tune)
    tune.add_argument("--timeout", type=float, default=None, metavar="S",
                      help="end a trial that makes no progress for S seconds (status 'timeout')")  # fmt: skip
    tune.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    tune.add_argument("--resume", action="store_true",
                      help="continue the stored search of the same workload, window, space and objective")  # fmt: skip
    tune.add_argument("--export", default=None, choices=("snippet", "json", "command"),
                      help="print the best configuration in this format after the summary")  # fmt: skip
    tune.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    tune.add_argument("--quiet", action="store_true", help="no progress lines")
    add_store_arg(tune, saving=True)
    shared = tune.add_argument_group("one study, many tuners (see the 'Scaling out' docs page)")
    shared.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="postgresql://USER@HOST[:PORT]/DATABASE holding the shared Optuna study",
    )
    shared.add_argument(
        "--study",
        default=None,
        metavar="NAME",
        help="the study's name: every process (on any machine) given the same joins it",
    )
    shared.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="start N tuner processes here, all joining the study (one per GPU on a GPU node)",
    )
    tune.set_defaults(handler=_cmd_tune, runs_trials=True)


def _cmd_tune(args: argparse.Namespace) -> int:
    from workbench.protocol import Protocol
    from workbench.tune import DEFAULT_PLANNED_STEPS, tune
    from workbench.tune.space import read_space_file

    if args.workers != 1:
        return _cmd_workers(args)
    budget_s = parse_duration(args.budget)
    max_memory = parse_bytes(args.max_memory) if args.max_memory else None
    baseline = config_from(args.overrides)
    space = read_space_file(args.space) if args.space else None
    progress = None if args.quiet or args.json else _progress
    result = tune(
        args.workload,
        budget_s=budget_s,
        baseline=baseline,
        space=space,
        objective=args.objective,
        planned_steps=DEFAULT_PLANNED_STEPS if args.planned_steps is None else args.planned_steps,
        max_memory_bytes=max_memory,
        global_batch=args.global_batch,
        protocol=Protocol(precision=args.precision, budget_s=budget_s),
        warmup=args.warmup,
        steps=args.steps,
        device=args.device,
        preset=args.preset,
        store=store_arg(args),
        resume=args.resume,
        seed=args.seed,
        on_update=progress,
        timeout_s=args.timeout,
        storage=args.storage,
        study=args.study,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(summary(result))
        if args.export and result.best_config is not None:
            print("\n" + result.export(args.export))
    baseline_ok = result.baseline is not None and result.baseline.ok
    return 0 if baseline_ok else EXIT_FAILED_TRIAL


def _cmd_workers(args: argparse.Namespace) -> int:
    from workbench.cli.tune_workers import run_workers, strip_workers

    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.storage is None or args.study is None:
        raise UsageError(
            "--workers N shares one study between N processes: give --storage postgresql://... --study NAME"
        )
    return run_workers(strip_workers(args.argv[args.argv.index("tune") + 1 :]), args.workers, as_json=args.json)


def summary(result: Any) -> str:
    """The search in a few lines: the winner with its interval, runner-ups, the Pareto front."""
    from workbench.textfmt import format_bytes, table

    data = result.to_dict()
    unit = data["objective"]["unit"]
    lines = [f"tune {data['workload']} [{data['preset']}]: {len(data['trials'])} trials "
             f"({data['resumed_trials']} resumed), {data['budget_used_s']:.0f} s of {data['budget_s']:.0f} s; "
             f"objective {data['objective']['kind']} ({unit})"]  # fmt: skip
    best = data["best"]
    if best is None:
        lines.append(f"no result: {data['stop_reason']}")
    else:
        ci = best["speedup_ci"]
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        head = "best" if best["winner"] else "fastest contender (not significantly better than the baseline)"
        if best["winner"] and data["tied"]:
            head = "tied at the top (within noise; the first is the fastest measured, not a verdict)"
        lines.append(
            f"{head}: {best['describe']}  {best['speedup']:.2f}x{interval} over the baseline, {best['verdict']}"
        )
        for other in data["runner_ups"]:
            lines.append(f"  not significantly worse: {other['describe']} {other['speedup']:.2f}x")
    recommended = data.get("recommended") or {}
    if recommended.get("candidates"):
        helped = ", ".join(recommended["helped"]) or "none verified faster"
        lines.append(f"recommendations measured first: {len(recommended['candidates'])}; verified faster: {helped}"
                     + (f"; combined: {recommended['combined']}" if recommended.get("combined") else ""))  # fmt: skip
    promise = " (the same inputs and seed propose the same configurations)" if data["shared_study"] is None else ""
    lines.append(f"sampler: {data['sampler']}{promise}")
    rows = [[t["number"], t["stage"], _params(t["params"]), t["status"],
             f"{t['cost_ms']:.3g}" if t["cost_ms"] is not None else "-", format_bytes(t["peak_memory_bytes"]),
             t["reason"][:60]] for t in data["trials"]]  # fmt: skip
    lines.append(table(["#", "stage", "config", "status", unit, "peak", "reason"], rows))
    front = ", ".join(f"#{t['number']} ({t['cost_ms']:.3g} {unit}, {format_bytes(t['peak_memory_bytes'])})"
                      for t in data["pareto"])  # fmt: skip
    lines.append(f"Pareto front (cost vs peak memory): {front or 'none'}")
    if data["study_verdict"] is not None and not data["rungs"]:
        lines.append("verdict: from the shared study (another process ran the verification)")
    lines.append(f"stop: {data['stop_reason']}; stored as run {data['run_id']}")
    return "\n".join(lines)


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _progress(update: dict[str, Any]) -> None:
    if update.get("event") == "trial":
        trial = update["trial"]
        cost = f"{trial['cost_ms']:.3g}" if trial["cost_ms"] is not None else trial["status"]
        print(f"[{update['elapsed_s']:5.0f}s/{update['budget_s']:.0f}s] trial {trial['number']} "
              f"{_params(trial['params'])}: {cost}", file=sys.stderr)  # fmt: skip
    elif update.get("event") == "rung":
        rung = update["rung"]
        print(f"[{update['elapsed_s']:5.0f}s/{update['budget_s']:.0f}s] {rung['name']}: {rung['rounds']} rounds "
              f"({rung['stop_reason']})", file=sys.stderr)  # fmt: skip
