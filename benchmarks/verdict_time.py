"""Time to a verdict: a 5-configuration `compare` on the tiny BEV preset, end to end, process-isolated.

Run it twice: the first run warms the inductor cache (TORCHINDUCTOR_CACHE_DIR), the second is the
figure that counts. Prints seconds (target ≤ 90 s here) and each speedup with its interval.

    .venv/bin/python benchmarks/verdict_time.py [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from workbench.api import run_comparison
from workbench.config import TrainConfig

CANDIDATES = ["amp=bf16", "amp=bf16,channels_last=true", "amp=bf16,channels_last=true,compile=default",
              "activation_checkpointing=full"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".inductor-cache"))
    baseline = TrainConfig()
    began = time.perf_counter()
    outcome = run_comparison("bev-perception", baseline, [baseline.with_overrides(c) for c in CANDIDATES],
                             steps=args.steps, warmup=args.warmup)  # fmt: skip
    elapsed = time.perf_counter() - began
    print(f"5-configuration compare, bev-perception tiny, {args.steps} steps each: {elapsed:.1f} s (target <= 90 s)")
    for row in outcome.comparison.candidates:
        ci = f"[{row.speedup_ci[0]:.2f}, {row.speedup_ci[1]:.2f}]" if row.speedup_ci else "n/a"
        speedup = f"{row.speedup:.2f}x" if row.speedup else "n/a"
        print(f"  {row.summary.label:45s} {speedup:>7s} {ci:>14s}  {row.verdict}  numerics={row.numerics_ok}")


if __name__ == "__main__":
    main()
