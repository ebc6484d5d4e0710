"""Worker start-up cost: seconds from `run_trial(isolation='process')` to the worker's TrialStarted,
and the whole process-isolated trial minus the same trial inline. Target ≤ 3 s here.

Then what a comparison pays for N workers: N trials each starting its own worker, against
N trials on workers `prestart`ed together first (the protocol does this before measuring).

    .venv/bin/python benchmarks/worker_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from workbench.measure import TrialStarted
from workbench.measure.child import discard_spares, prestart
from workbench.trials import run_trial
from workbench.workloads import Workload


def tiny_workload() -> Workload:
    return Workload.from_callables(
        model_fn=lambda: nn.Linear(16, 1),
        batch_fn=lambda n, g: (torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        name="linear",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    to_started, overhead = [], []
    for _ in range(args.repeats):
        started: list[float] = []

        def on_event(event: object, started: list[float] = started) -> None:
            if isinstance(event, TrialStarted):
                started.append(time.perf_counter())

        began = time.perf_counter()
        run_trial(tiny_workload(), steps=2, warmup=1, on_event=on_event)
        isolated = time.perf_counter() - began
        to_started.append(started[0] - began)
        began = time.perf_counter()
        run_trial(tiny_workload(), steps=2, warmup=1, isolation="inline")
        overhead.append(isolated - (time.perf_counter() - began))
    print(f"{args.repeats} repeats, tiny linear workload")
    print(f"spawn -> TrialStarted   median {statistics.median(to_started):.2f} s")
    print(f"isolated - inline       median {statistics.median(overhead):.2f} s   (target <= 3 s)")
    for count in (3, 6):
        began = time.perf_counter()
        for _ in range(count):
            run_trial(tiny_workload(), steps=2, warmup=1)
        cold = time.perf_counter() - began
        began = time.perf_counter()
        ready = prestart(count)
        for _ in range(count):
            run_trial(tiny_workload(), steps=2, warmup=1)
        warm = time.perf_counter() - began
        discard_spares()
        print(
            f"{count} trials: own workers {cold:.1f} s, prestarted ({ready} ready) {warm:.1f} s, ratio {warm / cold:.2f}"
        )


if __name__ == "__main__":
    main()
