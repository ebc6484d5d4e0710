"""Harness overhead: workbench median step ÷ a bare hand-written loop (same model, config, process).

Target ≤ 1.01. The two run interleaved in alternating order (bare-workbench, workbench-bare, ...):
measured here, whichever runs second in a pair is ~8% slower (the first's freed memory and
threads), so a fixed order biases the ratio by that much. The ratio is of medians over all rounds.

    .venv/bin/python benchmarks/harness_overhead.py [--workload bev-perception] [--rounds 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from workbench.config import TrainConfig
from workbench.trials import run_trial
from workbench.workloads import load_workload


def bare_loop_ms(workload_name: str, steps: int, warmup: int) -> list[float]:
    """What a user would write: model, AdamW, loader, forward/backward/step, perf_counter per step."""
    workload = load_workload(workload_name)
    config = TrainConfig()
    torch.manual_seed(config.seed)
    model = workload.model_fn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=False)
    batches = iter(workload.make_loader(config))
    times = []
    for i in range(warmup + steps):
        begin = time.perf_counter()
        batch = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = workload.loss_fn(workload.forward_fn(model, batch), batch)
        loss.backward()
        optimizer.step()
        if i >= warmup:
            times.append((time.perf_counter() - begin) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="bev-perception")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    bare: list[float] = []
    harness: list[float] = []

    def run_harness() -> None:
        result = run_trial(
            args.workload, TrainConfig(), steps=args.steps, warmup=args.warmup, track_memory=False, isolation="inline"
        )  # same process as the bare loop, by design
        harness.extend(result.step_ms)

    def run_bare() -> None:
        bare.extend(bare_loop_ms(args.workload, args.steps, args.warmup))

    for round_index in range(args.rounds):
        pair = (run_bare, run_harness) if round_index % 2 == 0 else (run_harness, run_bare)
        for run in pair:
            gc.collect()
            run()
    bare_median, harness_median = statistics.median(bare), statistics.median(harness)
    print(f"workload {args.workload}, {args.rounds} interleaved rounds x {args.steps} steps")
    print(f"bare loop median      {bare_median:8.2f} ms")
    print(f"workbench median      {harness_median:8.2f} ms")
    print(f"ratio workbench/bare  {harness_median / bare_median:8.3f}   (target <= 1.01)")


if __name__ == "__main__":
    main()
