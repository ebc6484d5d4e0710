"""Tune reproducibility: the same `tune` twice; do the two runs agree (same winner, or both a tie)?

For each run it prints the verified winner, its speedup over the baseline with the interval, the
best single recommended lever's speedup (measured by the protocol in the same run), the ratio of
the two (target: >= 1 within the winner's interval: the search never ends worse than the advice it
started from) and the seconds spent. Run it on a quiet machine, twice per workload.

    .venv/bin/python benchmarks/tune_reproducibility.py [--workload bev-perception] [--preset tiny] [--budget 180]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from workbench.tune import TuneResult, tune


def best_recommended(result: TuneResult) -> dict[str, Any] | None:
    """The recommendations rung's fastest row: the best single lever the diagnosis advised."""
    found = result.recommended
    if found is None or found.rung is None:
        return None
    rows = found.rung.to_dict()["candidates"]
    rows = [r for r in rows if r["speedup"] is not None]
    return max(rows, key=lambda r: r["speedup"]) if rows else None


def one_run(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    began = time.monotonic()
    result = tune(args.workload, preset=args.preset, budget_s=args.budget, seed=seed, store=None)
    best = result.best()
    advice = best_recommended(result)
    ratio = best["speedup"] / advice["speedup"] if best and advice and best["speedup"] and advice["speedup"] else None
    return {"best": best, "tied": result.tied, "runner_ups": [r["describe"] for r in result.runner_ups()],
            "advice": advice, "ratio": ratio, "seconds": time.monotonic() - began, "stop": result.stop_reason}  # fmt: skip


def describe(run: dict[str, Any]) -> str:
    best, advice = run["best"], run["advice"]
    if best is None:
        return f"no result ({run['stop']}), {run['seconds']:.0f} s"
    ci = best["speedup_ci"] or [float("nan"), float("nan")]
    found = (
        best["describe"] if best["winner"] else f"no verified winner (keep the baseline); fastest {best['describe']}"
    )
    text = f"{'tied: ' if run['tied'] else ''}{found} {best['speedup']:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]"
    if run["tied"]:
        text += f" with {', '.join(run['runner_ups'])}"
    if advice is not None:
        text += f"; best single recommendation {advice['describe']} {advice['speedup']:.2f}x"
    if run["ratio"] is not None:
        text += f"; winner/advice {run['ratio']:.2f}"
    return text + f"; {run['seconds']:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="bev-perception")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--budget", type=float, default=180.0, help="seconds per tune (default 180)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runs = [one_run(args, args.seed) for _ in range(2)]
    for index, run in enumerate(runs, start=1):
        print(f"run {index}: {describe(run)}")
    if any(run["best"] is None for run in runs):
        print("agree: n/a (a run ended without a verified result: see its stop reason)")
        return
    # The answer of a run that verified nothing faster is the baseline itself.
    first, second = (run["best"]["describe"] if run["best"]["winner"] else "the baseline" for run in runs)
    tied_names = [
        set([run["best"]["describe"], *run["runner_ups"]]) if run["best"]["winner"] else set() for run in runs
    ]
    agree = first == second or bool(tied_names[0] & tied_names[1])
    print(
        f"agree: {'yes' if agree else 'NO'} ({'same winner' if first == second else 'overlapping ties' if agree else 'different winners'})"
    )


if __name__ == "__main__":
    main()
