"""Time to a verdict: a 5-configuration `compare` on the tiny BEV preset, end to end, at the protocol's defaults.

Run it twice: the first run warms the inductor cache (TORCHINDUCTOR_CACHE_DIR); the figures that
count are the seconds (target ≤ 90 s here) and whether two consecutive runs give overlapping
intervals for every candidate and the same winner (or both a tie at the top).

    .venv/bin/python benchmarks/verdict_time.py [--steps 10]
    .venv/bin/python benchmarks/verdict_time.py --uncalibrated   # the old compare, for the ratio

`--uncalibrated` times what `compare` did before the protocol (one 20-step trial per
configuration, no rounds): the ratio of the two is the cost of calibration on this machine,
which the 90 s target (against ~35 s uncalibrated on a CPU with fast bf16) puts at ≤ 2.6x.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from workbench.api import run_comparison, run_trials
from workbench.config import TrainConfig
from workbench.terminal import protocol_notes

CANDIDATES = ["amp=bf16", "amp=bf16,channels_last=true", "amp=bf16,channels_last=true,compile=default",
              "activation_checkpointing=full"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="the characterizing trial's timed steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--uncalibrated", action="store_true", help="time one 20-step trial per configuration")
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".inductor-cache"))
    baseline = TrainConfig()
    if args.uncalibrated:
        began = time.perf_counter()
        run_trials("bev-perception", [baseline, *(baseline.with_overrides(c) for c in CANDIDATES)], steps=20,
                   warmup=args.warmup, store=None)  # fmt: skip
        print(f"uncalibrated 5-configuration compare (1 trial of 20 steps each): {time.perf_counter() - began:.1f} s")
        return
    began = time.perf_counter()
    outcome = run_comparison("bev-perception", baseline, [baseline.with_overrides(c) for c in CANDIDATES],
                             steps=args.steps, warmup=args.warmup, store=None)  # fmt: skip
    elapsed = time.perf_counter() - began
    comp = outcome.comparison
    print(f"5-configuration compare, bev-perception tiny: {elapsed:.1f} s (target <= 90 s); {comp.rounds} rounds "
          f"({comp.design}), {comp.stop_reason}")  # fmt: skip
    for index, row in enumerate(comp.candidates):
        ci = f"[{row.speedup_ci[0]:.3f}, {row.speedup_ci[1]:.3f}]" if row.speedup_ci else "n/a"
        speedup = f"{row.speedup:.3f}x" if row.speedup else "n/a"
        mark = " WINNER" if index == comp.winner else (" tied" if index in comp.tied else "")
        print(f"  {row.summary.label:45s} {speedup:>7s} {ci:>16s}  {row.verdict}  numerics={row.numerics_ok}{mark}")
    print("  " + "\n  ".join(protocol_notes(comp)))


if __name__ == "__main__":
    main()
