"""UI overhead: median step time of trials run from the live app ÷ the same trials run bare.

Target ≤ 1.01. "Live app attached" is the whole notebook path: `Workbench` submits the
trial through `start_trial` (worker process), its pump drains events at 4 Hz into the
charts' ColumnDataSources (Bokeh serializes every patch), the progress bars and the
table, and the device monitor samples at 10 Hz. Without a browser the widget messages
go nowhere, so the front end's own rendering (another process) is not counted.
"Without" is `run_trial(isolation="process")` with no event sink. Rounds alternate in
ABBA order (bare, live, live, bare, ...).

    .venv/bin/python benchmarks/ui_overhead.py [--workload bev-perception] [--rounds 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import warnings

from workbench.config import TrainConfig
from workbench.trials import run_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", default="bev-perception")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    # Benchmark trials stay out of the user's run history (and its schema): a throwaway store.
    os.environ.setdefault("WORKBENCH_STORE", os.path.join(tempfile.mkdtemp(prefix="wb-bench-"), "history.sqlite"))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no kernel here: ipywidgets may note that it has no comm
        from workbench.ui import Workbench

        app = Workbench(args.workload, warmup=args.warmup, steps=args.steps)
    bare: list[float] = []
    live: list[float] = []
    try:
        for index in range(args.rounds):
            # ABBA order: whichever runs second in a round is each side half the time.
            for attached in (False, True) if index % 2 == 0 else (True, False):
                if attached:
                    entry = app.run_baseline(TrainConfig())
                    assert entry is not None, app.status.value
                    app.wait()
                    result = entry.results()[-1]
                    assert result.ok, f"{result.status}: {result.message}"
                    live += result.step_ms
                else:
                    plain = run_trial(args.workload, TrainConfig(), steps=args.steps, warmup=args.warmup)
                    assert plain.ok, f"{plain.status}: {plain.message}"
                    bare += plain.step_ms
        points = len(app.charts.step_points.data["step_ms"])
        device_points = len(app.charts.utilization.data["t"])
    finally:
        app.close()
    bare_median, live_median = statistics.median(bare), statistics.median(live)
    print(f"workload {args.workload}, {args.rounds} interleaved rounds x {args.steps} steps")
    print(f"chart points at the end  {points} step times, {device_points} device samples")
    print(f"median bare trial        {bare_median:8.2f} ms")
    print(f"median with live app     {live_median:8.2f} ms")
    print(f"ratio live/bare          {live_median / bare_median:8.3f}   (target <= 1.01)")


if __name__ == "__main__":
    main()
