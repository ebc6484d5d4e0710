"""Watch overhead: a loop's median step time under `wb.watch` ÷ the same loop bare (same model, process).

Target ≤ 1.01 on every built-in workload's tiny preset. Paired rounds in alternating order
(bare-watched, watched-bare, ...), because whichever leg runs second in a pair runs under
different memory and thread state; the figure is the median of the rounds' ratios. Both
legs are timed by this script's own perf_counter, not by the watch; the watched leg writes
to a real run history (a temporary file) through the watch's writer thread, with the
utilization monitor on, as a user's job would.

    .venv/bin/python benchmarks/watch_overhead.py [--rounds 6] [--steps 20] [--workloads bev-perception,...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import workbench as wb
from workbench.config import TrainConfig
from workbench.workloads import builtin_workloads, load_workload


def leg_ms(workload: Any, model: Any, optimizer: Any, batches: Any, steps: int, watcher: Any) -> list[float]:
    """One leg of `steps` steps, each timed here; `watcher` None runs bare."""
    times = []
    source = watcher.batches(batches) if watcher is not None else batches
    for _ in range(steps):
        begin = time.perf_counter()
        batch = next(source)
        optimizer.zero_grad(set_to_none=True)
        loss = workload.loss_fn(workload.forward_fn(model, batch), batch)
        loss.backward()
        optimizer.step()
        if watcher is not None:
            watcher.step(loss=loss)
        times.append((time.perf_counter() - begin) * 1000)
    return times


def ratios_for(name: str, rounds: int, steps: int, warmup: int, store: Path) -> list[float]:
    workload = load_workload(name)
    config = TrainConfig()
    torch.manual_seed(config.seed)
    model = workload.model_fn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=False)
    batches = iter(workload.make_loader(config))

    def endless() -> Any:
        nonlocal batches
        while True:
            try:
                yield next(batches)
            except StopIteration:
                batches = iter(workload.make_loader(config))

    source = endless()
    leg_ms(workload, model, optimizer, source, warmup, None)
    out = []
    for index in range(rounds):
        medians = {}
        for kind in ("bare", "watched") if index % 2 == 0 else ("watched", "bare"):
            if kind == "bare":
                medians[kind] = statistics.median(leg_ms(workload, model, optimizer, source, steps, None))
            else:
                with wb.watch(model, optimizer, name=f"overhead-{name}", store=store, warmup=0) as w:
                    medians[kind] = statistics.median(leg_ms(workload, model, optimizer, source, steps, w))
        out.append(medians["watched"] / medians["bare"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(builtin_workloads()))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.workloads.split(","):
            ratios = ratios_for(name, args.rounds, args.steps, args.warmup, Path(folder) / "history.sqlite")
            print(f"{name:18s} watched/bare median {statistics.median(ratios):.4f}  rounds: "
                  + " ".join(f"{r:.3f}" for r in ratios))  # fmt: skip


if __name__ == "__main__":
    main()
