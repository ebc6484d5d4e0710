"""Memory estimate vs the real peak, per built-in workload, with and without activation checkpointing.

On CUDA the real peak is `torch.cuda.max_memory_allocated` over a trial's timed window (base
presets); on a CPU it is the tensor tracker's peak (tiny presets, where the estimate must be
within 5%). One line per case: estimate, real, ratio. Exit 1 when a ratio leaves the tolerance.

    PYTHONPATH=. python3 benchmarks/estimate_accuracy.py [--preset base] [--tolerance 0.15]
"""

from __future__ import annotations

import argparse
import sys

import torch

from workbench.config import TrainConfig
from workbench.estimate import estimate_memory
from workbench.trials import run_trial
from workbench.workloads import builtin_workloads


def main() -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base" if cuda else "tiny")
    parser.add_argument("--tolerance", type=float, default=0.15 if cuda else 0.05)
    args = parser.parse_args()
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"estimate vs {'max_memory_allocated' if cuda else 'tracked peak'} on {device_name}, preset {args.preset}")
    failed = 0
    for name in sorted(builtin_workloads()):
        for policy in ("off", "full"):
            config = TrainConfig(activation_checkpointing=policy)
            real = run_trial(name, config, warmup=2, steps=3, device="cuda" if cuda else "cpu", preset=args.preset)
            if not real.ok or not real.peak_memory_bytes:
                print(f"{name:16} checkpointing={policy:4}  trial {real.status}: {real.message.splitlines()[:1]}")
                failed += 1
                continue
            estimate = estimate_memory(name, config, device_name, preset=args.preset)
            ratio = estimate.peak_bytes / real.peak_memory_bytes
            ok = abs(ratio - 1.0) <= args.tolerance
            failed += not ok
            print(f"{name:16} checkpointing={policy:4}  estimate {estimate.peak_bytes / 2**30:7.3f} GiB  "
                  f"real {real.peak_memory_bytes / 2**30:7.3f} GiB  ratio {ratio:.3f}{'' if ok else '  OUT OF TOLERANCE'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
