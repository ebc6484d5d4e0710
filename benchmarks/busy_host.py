"""A/A comparisons while other work starts and stops at known times: false verdicts per pattern.

Runs `run_comparison` at the CLI's defaults (bev-perception tiny, fp32 against fp32), N times
per disturbance pattern, the patterns interleaved so a drifting machine hits them alike. The
disturbance is ours, started and stopped at set seconds after the first paired round ends (the
rounds, not the characterizing trials before them, give the verdict; a comparison's rounds last
~5–50 s here):
- quiet: nothing (the control);
- step: one CPU burner switched on 3 s in, left on to the end;
- bursts: one CPU burner on for 1.5 s, three times, 3 s apart;
- steady: one CPU burner from before the comparison starts to its end;
- two: two CPU burners for 5 s, from 2 s in (the issue's case, scaled to the rounds' length);
- membw: one process copying 64 MiB arrays (CPU and memory bandwidth) for 5 s, from 2 s in.
Any "faster"/"slower" is a false verdict (target: at most 1 in 10 per pattern). Each line also
gives the verdict the same rounds would have had with every round kept (the rule before the
host-load check), how many rounds the load changed in, the usual per-round load, and how much
the round-to-round spread was. Someone else's work on the host is not ours: the line's
"other cores" over the whole comparison says when there was more than we made.

    PYTHONPATH=. .venv/bin/python benchmarks/busy_host.py [--n 5] [--patterns step,bursts,...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

from workbench.analysis.compare import UnitLog, estimate
from workbench.analysis.hostshift import unit_load
from workbench.analysis.intervals import verdict_for
from workbench.api import run_comparison
from workbench.config import TrainConfig
from workbench.measure import RoundMeasured
from workbench.protocol import Protocol

WORKLOAD = "bev-perception"
# Each burner ends by itself once its parent (this benchmark) is gone, even if it was killed.
CPU_BURNER = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
MEMBW_BURNER = (
    "import os\nimport numpy as np\na = np.ones(8 << 20); b = np.empty_like(a)\nparent = os.getppid()\n"
    "while os.getppid() == parent: np.copyto(b, a)"
)

#: pattern -> [(start s, stop s, burners, code)], seconds after the first paired round's end
#: (a negative start: from before the comparison begins).
PATTERNS: dict[str, list[tuple[float, float, int, str]]] = {
    "quiet": [],
    "step": [(3.0, 999.0, 1, CPU_BURNER)],
    "bursts": [(1.0, 2.5, 1, CPU_BURNER), (5.5, 7.0, 1, CPU_BURNER), (10.0, 11.5, 1, CPU_BURNER)],
    "steady": [(-1.0, 999.0, 1, CPU_BURNER)],
    "two": [(2.0, 7.0, 2, CPU_BURNER)],
    "membw": [(2.0, 7.0, 1, MEMBW_BURNER)],
}


class Disturbance:
    """Burner processes switched on and off on a schedule, from a thread (the comparison runs here).

    They are killed on time but reaped only after the comparison returns: a child reaped during
    it would add its CPU to ours (`os.times`) and hide from the comparison's host-load figure."""

    def __init__(self, schedule: list[tuple[float, float, int, str]]) -> None:
        self.schedule, self.procs, self.stop = schedule, [], threading.Event()
        self.rounds_began = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def on_event(self, event: object) -> None:
        """The comparison's events: the first paired round's end starts the schedule's clock."""
        if isinstance(event, RoundMeasured) and not self.rounds_began.is_set():
            self.began = time.monotonic()
            self.rounds_began.set()

    def __enter__(self) -> Disturbance:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for proc in self.procs:
            proc.kill()
            proc.wait()

    def _run(self) -> None:
        ons = [(start, "on", i) for i, (start, _, _, _) in enumerate(self.schedule)]
        offs = [(stop, "off", i) for i, (_, stop, _, _) in enumerate(self.schedule)]
        events = sorted(ons + offs)
        running: dict[int, list[subprocess.Popen]] = {}
        if events and events[0][0] < 0:  # on before the comparison: its clock starts now
            self.began = time.monotonic() - events[0][0]
        else:
            while not self.rounds_began.wait(0.05):
                if self.stop.is_set():
                    return
        for at, what, index in events:
            if self.stop.wait(max(0.0, self.began + at - time.monotonic())):
                break
            if what == "on":
                _, _, count, code = self.schedule[index]
                running[index] = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
                self.procs += running[index]
            else:
                for proc in running.pop(index, []):
                    proc.kill()
        for procs in running.values():
            for proc in procs:
                proc.kill()


def one(pattern: str, protocol: Protocol) -> dict:
    began = time.perf_counter()
    with Disturbance(PATTERNS[pattern]) as load:
        if PATTERNS[pattern] and PATTERNS[pattern][0][0] < 0:
            time.sleep(1.0)  # a steady load is on before the comparison starts
        outcome = run_comparison(
            WORKLOAD,
            TrainConfig(),
            [TrainConfig()],
            protocol=protocol,
            preset="tiny",
            store=None,
            on_event=load.on_event,
        )
    comp, row = outcome.comparison, outcome.comparison.candidates[0]
    every = estimate(outcome.log, 0, 1, paired=comp.paired, confidence=comp.confidence, set_aside=False)
    kept_all = verdict_for(every, comp.equivalence_margin, comp.precision) if every is not None else "inconclusive"
    return {
        "rounds_detail": round_lines(outcome.log) if row.verdict in ("faster", "slower") else [],
        "pattern": pattern,
        "verdict": row.verdict,
        "all_rounds": kept_all,
        "speedup": row.speedup,
        "ci": row.speedup_ci,
        "rounds": comp.rounds,
        "affected": len(row.load_changed_rounds),
        "usual": comp.noise.usual_load_cores,
        "spread": row.between_unit_sd,
        "drift": comp.noise.baseline_drift,
        "other": comp.noise.host_other_cores,
        "seconds": time.perf_counter() - began,
    }


def round_lines(log: UnitLog) -> list[str]:
    """Each round's ratio and both sides' loads: printed under a false verdict, to see how it arose."""
    lines = []
    for r in sorted(set(log.medians.get(0, {})) & set(log.medians.get(1, {}))):
        ratio = log.medians[0][r] / log.medians[1][r]
        loads = [unit_load(log.loads.get(config, {}).get(r)) for config in (0, 1)]
        shown = ", ".join("n/a" if x is None else f"{x:.2f}" for x in loads)
        lines.append(f"round {r} at {log.began_s.get(r, 0.0):.1f} s: ratio {ratio:.3f}, loads {shown}")
    return lines


def fmt(r: dict) -> str:
    ci = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else "n/a"
    speedup = f"{r['speedup']:.3f}" if r["speedup"] is not None else "n/a"
    usual = f"{r['usual']:.2f}" if r["usual"] is not None else "n/a"
    spread = f"{r['spread']:.1%}" if r["spread"] is not None else "n/a"
    drift = f"{r['drift']:.1%}" if r["drift"] is not None else "n/a"
    head = f"{r['pattern']:>6}: {r['verdict']:<25} (all rounds kept: {r['all_rounds']}) {speedup} {ci}; "
    load = f"{r['affected']}/{r['rounds']} rounds load changed, usual {usual} cores, "
    noise = (
        f"round-to-round {spread}, baseline drift {drift}, other cores {r['other'] or 0.0:.2f}, {r['seconds']:.0f} s"
    )
    return head + load + noise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="A/A comparisons per pattern (default 10)")
    parser.add_argument("--patterns", default=",".join(PATTERNS), help=f"comma-separated, of {', '.join(PATTERNS)}")
    args = parser.parse_args()
    patterns = [p for p in args.patterns.split(",") if p]
    unknown = set(patterns) - set(PATTERNS)
    if unknown:
        parser.error(f"unknown pattern(s): {', '.join(sorted(unknown))}")
    protocol = Protocol()
    results: dict[str, list[dict]] = {p: [] for p in patterns}
    for i in range(args.n):
        for pattern in patterns:
            results[pattern].append(one(pattern, protocol))
            print(f"{i + 1}/{args.n} {fmt(results[pattern][-1])}", flush=True)
            for line in results[pattern][-1]["rounds_detail"]:
                print(f"      {line}", flush=True)
    print("\nfalse A/A verdicts per pattern (target <= 1 in 10); with every round kept; inconclusive")
    for pattern, rows in results.items():
        false = sum(r["verdict"] in ("faster", "slower") for r in rows)
        old = sum(r["all_rounds"] in ("faster", "slower") for r in rows)
        inconclusive = sum(r["verdict"] == "inconclusive" for r in rows)
        seconds = max(r["seconds"] for r in rows)
        counts = f"{false}/{len(rows)}; all rounds kept {old}/{len(rows)}; inconclusive {inconclusive}/{len(rows)}"
        print(f"  {pattern:>6}: {counts}; longest {seconds:.0f} s")


if __name__ == "__main__":
    main()
