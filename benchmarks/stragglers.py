"""Is the straggler verdict calibrated on real ranks here? False alarms without a fault, detection of a 10% delay.

Runs 2-rank gloo jobs through both documented paths:
- the distributed trial (`run_trial` with DDP), and
- a watched torchrun job (`wb.watch` on every rank, read back with `watched_job`), all jobs of one
  path run one after another in one launch.
Two kinds of step, since where a step's time goes decides what can be told apart:
- `waiting`: a small model whose forward waits 20 ms on every rank, as a host waits for its GPU;
- `compute`: a step of tens of ms of CPU matmuls, where identical ranks' processes differ by 5-10%
  for their whole life (the rule holds lateness spent computing to 20% of the step).
No-fault runs: any named straggler is a false alarm. Fault runs: one rank sleeps 10% of the no-fault
step in one phase (data, forward, backward, optimizer in turn, on rank 0 and rank 1 in turn);
detected = that rank named with that phase.

    .venv/bin/python benchmarks/stragglers.py [--n 8] [--paths trial,watch] [--kinds waiting,compute] [--share 0.10]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fault-injecting workload is the tests' known truth

from straggler_workload import PHASES, launch_watched, straggler_workload  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.analysis.ranks import straggler_check  # noqa: E402
from workbench.config import TrainConfig  # noqa: E402
from workbench.trials import run_trial  # noqa: E402

KINDS = {"waiting": {"width": 256, "batch": 64, "device_s": 0.02}, "compute": {"width": 4096, "batch": 1024}}
"""Per kind of step: the model's width, the global batch and the wait every rank's forward makes."""
TRIAL_STEPS, WATCH_STEPS = 20, 60
"""A trial's default window; a watched job's recent steps (a real job has hundreds)."""
Verdict = tuple[int | None, str | None, float]


def faults(n: int) -> list[tuple[str, int]]:
    """(phase, slow rank) for n fault runs: every phase, rank 0 and rank 1 in turn."""
    cycle = itertools.cycle([(phase, rank) for rank in (0, 1) for phase in PHASES])
    return [next(cycle) for _ in range(n)]


def trial_verdict(kind: dict, phase: str | None, slow: int, delay_s: float) -> Verdict:
    workload = straggler_workload(
        phase, slow, delay_s, width=kind["width"], batch_size=kind["batch"], device_s=kind.get("device_s", 0.0)
    )
    result = run_trial(workload, TrainConfig(strategy="ddp", nproc_per_node=2), warmup=3, steps=TRIAL_STEPS)
    if result.status != "ok":
        raise RuntimeError(result.message)
    check = straggler_check(result)
    assert check is not None
    return check.straggler, check.cause, check.step_ms


def watch_verdicts(kind: dict, specs: list[tuple[str, int, float]]) -> list[Verdict]:
    """Each (phase, slow rank, delay) as one watched job of a single 2-rank launch."""
    with tempfile.TemporaryDirectory() as tmp:
        named = [f"{phase}:{slow}:{delay}:{index}" for index, (phase, slow, delay) in enumerate(specs)]
        sizes = {"width": kind["width"], "batch": kind["batch"], "device_s": kind.get("device_s", 0.0)}
        store = launch_watched(Path(tmp), 2, named, steps=WATCH_STEPS, **sizes)
        out = []
        for index, (phase, slow, _) in enumerate(specs):
            check = wb.watch.watched_job(f"{phase}-{slow}-{index}", store=store).check
            assert check is not None
            out.append((check.straggler, check.cause, check.step_ms))
        return out


def report(label: str, quiet: list[Verdict], faulty: list[Verdict], truth: list[tuple[str, int]]) -> None:
    false = sum(s is not None for s, _, _ in quiet)
    hits = sum(s == slow and c == phase for (s, c, _), (phase, slow) in zip(faulty, truth))
    misses = [f"{phase}@{slow}->{s}:{c}" for (s, c, _), (phase, slow) in zip(faulty, truth) if (s, c) != (slow, phase)]
    step = statistics.median(t for _, _, t in quiet)
    print(
        f"{label:16s} false alarms {false}/{len(quiet)} ({false / len(quiet):.0%}), detected {hits}/{len(faulty)} "
        f"({hits / len(faulty):.0%}) at a median no-fault step of {step:.1f} ms"
        + (f"; missed: {', '.join(misses)}" if misses else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="no-fault runs, and fault runs, per path and kind")
    parser.add_argument("--paths", default="trial,watch")
    parser.add_argument("--kinds", default="waiting,compute")
    parser.add_argument("--share", type=float, default=0.10, help="the delay, as a share of the no-fault step")
    args = parser.parse_args()
    truth = faults(args.n)
    for name, path in itertools.product(args.kinds.split(","), args.paths.split(",")):
        kind, began = KINDS[name], time.perf_counter()
        if path == "trial":
            quiet = [trial_verdict(kind, None, 0, 0.0) for _ in range(args.n)]
            delay = args.share * statistics.median(t for _, _, t in quiet) / 1000.0
            faulty = [trial_verdict(kind, phase, slow, delay) for phase, slow in truth]
        else:
            quiet = watch_verdicts(kind, [("none", 0, 0.0)] * args.n)
            delay = args.share * statistics.median(t for _, _, t in quiet) / 1000.0
            faulty = watch_verdicts(kind, [(phase, slow, delay) for phase, slow in truth])
        report(f"{name} {path}", quiet, faulty, truth)
        print(f"{'':16s} delay {delay * 1000:.1f} ms; {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
