"""Worker start-up cost, for workers forked from the pre-imported server and for fresh interpreters
(`WORKBENCH_WORKER_START=spawn`): seconds from `run_trial(isolation='process')` to the worker's
TrialStarted, and the whole process-isolated trial minus the same trial inline. Target ≤ 3 s here.

Then what a comparison pays for N workers: N trials each starting its own worker, against
N trials on workers `prestart`ed together first (the protocol does this before measuring).

Last, that a forked worker times steps as a fresh interpreter does: bev-perception tiny's median
step in forked ÷ fresh workers, pairs alternating in order. Target: 1.00 within the noise.

    .venv/bin/python benchmarks/worker_startup.py [--repeats 5] [--pairs 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

from workbench.measure import TrialStarted, forkserver
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


def start_up(repeats: int) -> None:
    to_started, overhead = [], []
    for _ in range(repeats):
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
    print(f"  start -> TrialStarted   median {statistics.median(to_started):.2f} s")
    print(f"  isolated - inline       median {statistics.median(overhead):.2f} s   (target <= 3 s)")
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
        print(f"  {count} trials: own workers {cold:.1f} s, prestarted ({ready} ready) {warm:.1f} s, "
              f"ratio {warm / cold:.2f}")  # fmt: skip


def step_time_parity(pairs: int) -> None:
    medians: dict[str, list[float]] = {"fork": [], "spawn": []}
    for pair in range(pairs):
        for mode in ("fork", "spawn") if pair % 2 == 0 else ("spawn", "fork"):
            os.environ[forkserver.SWITCH_ENV] = mode
            result = run_trial("bev-perception", steps=20, warmup=3, track_memory=False)
            assert result.ok, result.message
            medians[mode].append(statistics.median(result.step_ms))
    ratios = [fork / spawn for fork, spawn in zip(medians["fork"], medians["spawn"])]
    print(f"bev-perception tiny, {pairs} alternating pairs: forked / fresh median step "
          f"{statistics.median(ratios):.3f} (pairs {min(ratios):.2f}-{max(ratios):.2f}; target 1.00 within the noise)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()
    for mode in ("fork", "spawn"):
        os.environ[forkserver.SWITCH_ENV] = mode
        print(f"{mode}: {args.repeats} repeats, tiny linear workload")
        start_up(args.repeats)
    step_time_parity(args.pairs)


if __name__ == "__main__":
    main()
