"""Tune efficiency: `tune` at 1/3 and 1/2 of an exhaustive sweep's time, against the sweep's best.

The space (listed below, 128 combinations, every one valid: ≥ 24 as the target asks) is swept
exhaustively — one fresh trial per configuration, ranked by the tuner's own objective
(throughput per sample, compile amortized over the planned steps). Then `tune` searches the
same space with a third and a half of the sweep's wall time. Each tune's best and the sweep's
best are re-measured together by the calibrated protocol against the baseline; the figure is

    ratio = tune best's cost ÷ sweep best's cost  (= sweep best's speedup ÷ tune best's speedup)

Target: ratio ≤ 1.05 at 1/3 of the budget on at least two of the three built-in workloads.
Long: on 2 CPU cores a sweep of one tiny workload takes tens of minutes (a cold inductor
compile costs about a minute; run `benchmarks/verdict_time.py` once first to warm the cache).

    .venv/bin/python benchmarks/tune_efficiency.py [--workloads bev-perception,e2e-planner,driving-vlm]
        [--no-compile] [--steps 8] [--sweeps FILE]

`--sweeps FILE` keeps each workload's sweep (its time and best) in FILE and reuses it when there:
a second run then repeats the searches, the random part, without another hour of sweeping.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.protocol import Protocol, run_protocol
from workbench.trials import run_trial
from workbench.tune import Objective, tune, user_space
from workbench.tune.objective import judge, objective_row
from workbench.workloads import load_workload

TARGET = 1.05


def space_for(batch: int, compile_modes: list[str]) -> dict[str, list[Any]]:
    """The defined space: 2^7 = 128 configurations (64 without compile)."""
    return {
        "amp": ["fp32", "bf16"],
        "channels_last": [False, True],
        "compile": compile_modes,
        "activation_checkpointing": ["off", "full"],
        "optimizer_impl": ["for-loop", "foreach"],
        "num_workers": [0, 2],
        "batch_size": [batch, batch * 2],
    }


def sweep(workload: str, space: dict[str, list[Any]], window: dict[str, Any], goal: Objective) -> dict[str, Any]:
    """Every configuration once, in a fresh worker; the best by the tuner's objective."""
    made = user_space(space, window["device"])
    baseline = TrainConfig()
    began = time.monotonic()
    base = run_trial(workload, baseline, **window)
    costs: list[tuple[float, TrainConfig]] = []
    for params in made.points():
        config = made.config(baseline, params)
        outcome = judge(run_trial(workload, config, **window), base, goal)
        if outcome.feasible and outcome.cost_ms is not None:
            costs.append((outcome.cost_ms, config))
    costs.sort(key=lambda c: c[0])
    return {"seconds": time.monotonic() - began, "configs": made.combinations, "ok": len(costs),
            "best": costs[0][1], "best_cost_ms": costs[0][0]}  # fmt: skip


def remeasure(workload: str, configs: list[TrainConfig], window: dict[str, Any], goal: Objective) -> list[float | None]:
    """Each config's objective speedup over the baseline, measured together by the protocol."""
    protocol = Protocol(precision=0.03, budget_s=120)
    outcome = run_protocol(workload, TrainConfig(), configs, protocol, store=None, **window)
    comp = outcome.comparison
    rows = [objective_row(r, comp.baseline, goal, margin=protocol.margin, precision=protocol.precision)
            for r in comp.candidates]  # fmt: skip
    return [r.speedup for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="bev-perception,e2e-planner,driving-vlm")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="compile off only (64 configurations)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of the script itself: amp x channels_last x batch (8 configurations; "
                             "1/3 of so short a sweep may be refused as too small a budget)")  # fmt: skip
    parser.add_argument("--planned-steps", type=int, default=10_000)
    parser.add_argument("--device", default=None)
    parser.add_argument("--shares", default="0.333,0.5", metavar="F,F",
                        help="the sweep's time shares to tune with (default 1/3 and 1/2; the target is at 1/3)")  # fmt: skip
    parser.add_argument("--sweeps", type=Path, default=None, metavar="FILE",
                        help="reuse the sweeps kept in FILE (same space and window), keep new ones there")  # fmt: skip
    args = parser.parse_args()
    kept = json.loads(args.sweeps.read_text()) if args.sweeps and args.sweeps.exists() else {}
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".inductor-cache"))
    window = dict(warmup=args.warmup, steps=args.steps, device=args.device, preset="tiny")
    goal = Objective("throughput", args.planned_steps)
    report = []
    for workload in args.workloads.split(","):
        batch = load_workload(workload, preset="tiny").batch_size
        space = space_for(batch, ["off"] if args.no_compile else ["off", "default"])
        if args.quick:
            space = {"amp": ["fp32", "bf16"], "channels_last": [False, True], "batch_size": [batch // 2, batch]}
        key = f"{workload} {json.dumps(space, sort_keys=True)} steps={args.steps} warmup={args.warmup}"
        if key in kept:
            swept = {**kept[key], "best": TrainConfig.from_dict(kept[key]["best"])}
            print(f"{workload}: reusing the sweep kept in {args.sweeps}")
        else:
            swept = sweep(workload, space, window, goal)
            if args.sweeps:
                kept[key] = {**swept, "best": swept["best"].to_dict()}
                args.sweeps.write_text(json.dumps(kept, indent=1))
        print(f"{workload}: sweep of {swept['configs']} configs ({swept['ok']} ran) in {swept['seconds']:.0f} s; "
              f"best {swept['best'].describe()} at {swept['best_cost_ms']:.3g} ms/sample", flush=True)  # fmt: skip
        line: dict[str, Any] = {"workload": workload, "sweep_s": swept["seconds"], "configs": swept["configs"]}
        for share in (float(f) for f in args.shares.split(",")):
            try:
                result = tune(workload, budget_s=swept["seconds"] * share, space=space, objective="throughput",
                              planned_steps=args.planned_steps, store=None, **window)  # fmt: skip
            except ConfigError as exc:  # e.g. a --quick sweep too short for a search at this share
                print(f"  tune at {share:.2f} of the sweep: refused: {exc}")
                continue
            found = result.best_config
            measured = sum(1 for t in result.trials if t.result is not None)
            if found is None:
                print(f"  tune at {share:.2f} of the sweep: no best ({result.stop_reason})")
                continue
            tuned, exhaustive = remeasure(workload, [found, swept["best"]], window, goal)
            ratio = exhaustive / tuned if tuned and exhaustive else None
            ok = ratio is not None and ratio <= TARGET
            print(f"  tune at {share:.2f} of the sweep ({measured} trials, {result.budget_used_s:.0f} s): "
                  f"best {found.describe()}; ratio to the sweep's best "
                  f"{'n/a' if ratio is None else f'{ratio:.3f}'} (target <= {TARGET}) {'PASS' if ok else 'MISS'}",
                  flush=True)  # fmt: skip
            line[f"ratio_{share:.2f}"] = ratio
            line[f"trials_{share:.2f}"] = measured
        report.append(line)
    passed = sum(1 for line in report if (line.get("ratio_0.33") or 99) <= TARGET)  # 1/3 is the target's share
    print(f"within {TARGET - 1:.0%} at 1/3 of the sweep's time: {passed} of {len(report)} workloads (target: 2 of 3)")
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
