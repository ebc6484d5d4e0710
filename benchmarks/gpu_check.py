"""`scripts/gpu-check`: the most GPU evidence a short loan allows, in at most 6 minutes, so a rerun fits too.

A lent GPU machine comes for 15 minutes of device time in all, a minute or two of it starting up.
So every section runs as its own process under its own time cap: one that fails or runs out says
so and the next one runs, and the whole check stops starting sections when its budget is spent.
The functional GPU tests run in parallel with the figures that are not timings (they only share
the GPU); the timed sections then run alone, one after another. Everything lands in one folder:
a log per section, `summary.txt` and `summary.json`. Standard library only here: the sections
import torch, so a missing package is named by the preflight, not by a traceback.

    PYTHONPATH=. python3 benchmarks/gpu_check.py [--dry-run] [--out DIR] [--budget S]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PARTS = "benchmarks/gpu_check_parts.py"
#: The whole check's wall-clock budget: 6 minutes less a margin for the summary and stragglers.
BUDGET_S = 345.0
#: A section left with less than this of the budget is not started.
MIN_START_S = 5.0
#: After its cap, a section's process group gets SIGTERM, then SIGKILL this much later.
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Section:
    name: str
    cap_s: float
    phase: str
    """'setup' (in order, first), 'parallel' (together) or 'timed' (alone, in order)."""
    argv: tuple[str, ...]
    dry_argv: tuple[str, ...] | None = None
    """What the dry run runs on a CPU; None: nothing, for `dry_reason`."""
    dry_reason: str = ""
    required: bool = False
    """The check stops when this one fails (the preflight: nothing else could run)."""
    key: Callable[[str], str] | None = None
    """The key figure from the log (default: its last `key:` line, else its last line)."""


@dataclass
class Outcome:
    name: str
    phase: str
    cap_s: float
    status: str
    """'ok', 'failed (exit N)', 'ran out at the Ns cap', 'skipped: ...', 'not on CPU: ...'."""
    seconds: float = 0.0
    key: str = ""
    log: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok" or self.status.startswith("not on CPU")


@dataclass
class _Running:
    section: Section
    process: subprocess.Popen[bytes]
    log_path: Path
    began: float
    cap_s: float
    outcome: Outcome | None = field(default=None)


def pytest_key(text: str) -> str:
    """pytest's closing tally, e.g. '41 passed, 21 skipped in 97.1s'."""
    found = re.findall(r"=+ (.*(?:passed|failed|skipped|error|no tests ran).*) =+", text)
    if found:
        return found[-1]
    collected = re.findall(r"(\d+ tests? collected.*)", text)
    return collected[-1].strip() if collected else _last_line(text)


def diagnosis_key(text: str) -> str:
    found = re.findall(r"^Diagnosis — (.*)$", text, flags=re.MULTILINE)
    return found[-1] if found else _last_line(text)


def compare_key(text: str) -> str:
    rows = [line for line in text.splitlines() if "— best" in line or "tied for best" in line]
    return " ".join(rows[0].split())[:100] if rows else "no winner: " + _last_line(text)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:100] if lines else ""


def default_key(text: str) -> str:
    found = re.findall(r"^key: (.*)$", text, flags=re.MULTILINE)
    return found[-1] if found else _last_line(text)


def gpu_tests(shard: int, shards: int) -> tuple[str, ...]:
    """Every other GPU test file: two pytest processes share the GPU and the CPU's cores."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    return (PY, "-m", "pytest", *files[shard::shards], "-v", "-rs", "-p", "no:cacheprovider",
            "-W", "ignore::pytest.PytestConfigWarning", "--durations=8")  # fmt: skip


def sections() -> list[Section]:
    collect = (PY, "-m", "pytest", "tests/gpu", "-q", "--collect-only", "-p", "no:cacheprovider")
    compare = (
        "--workload",
        "bev-perception",
        "--preset",
        "base",
        "--steps",
        "10",
        "--warmup",
        "3",
        "--quiet",
        "--budget",
        "40",
        "--baseline",
        "amp=fp32",
        "--candidate",
        "amp=bf16",
        "--candidate",
        "amp=bf16,channels_last=true",
        "--candidate",
        "amp=bf16,channels_last=true,cuda_graphs=true",
    )
    return [
        Section(
            "preflight",
            30,
            "setup",
            (PY, "-m", "workbench.preflight"),
            (PY, "-m", "workbench.preflight"),
            required=True,
            key=lambda text: "packages importable",
        ),
        Section("device and capabilities", 40, "setup", (PY, PARTS, "device"), (PY, PARTS, "device", "--dry-run")),
        Section("GPU tests (1 of 2)", 150, "parallel", gpu_tests(0, 2), collect, key=pytest_key),
        Section(
            "GPU tests (2 of 2)",
            150,
            "parallel",
            gpu_tests(1, 2),
            None,
            "the CPU run collects every GPU test once, in part 1",
            key=pytest_key,
        ),
        Section(
            "GPU-path figures",
            90,
            "parallel",
            (PY, "benchmarks/gpu_path_figures.py"),
            (PY, "benchmarks/gpu_path_figures.py"),
        ),
        Section(
            "memory estimate vs max_memory_allocated",
            120,
            "parallel",
            (PY, "benchmarks/estimate_accuracy.py"),
            None,
            "six trials; tests/test_estimate.py checks the estimate on CPU",
        ),
        Section(
            "float8 plan vs torchao's filter (e2e-planner base)",
            40,
            "parallel",
            (PY, PARTS, "float8-plan"),
            (PY, PARTS, "float8-plan", "--dry-run"),
        ),
        Section(
            "compile warm-up for the MFU section (untimed)",
            150,
            "parallel",
            (PY, PARTS, "compile-warmup"),
            None,
            "a cold inductor compile of the VLM's base preset takes minutes on a small CPU",
        ),
        Section(
            "external timer vs workbench run (base presets, fp32/bf16)",
            75,
            "timed",
            (PY, PARTS, "external-timer"),
            (PY, PARTS, "external-timer", "--dry-run"),
        ),
        Section(
            "MFU of driving-vlm base bf16 (eager, compiled)",
            60,
            "timed",
            (PY, PARTS, "mfu"),
            (PY, PARTS, "mfu", "--dry-run"),
        ),
        Section(
            "watched loop vs workbench trial (bev-perception base bf16)",
            45,
            "timed",
            (PY, PARTS, "watched"),
            (PY, PARTS, "watched", "--dry-run"),
        ),
        Section(
            "compare (bev-perception base)",
            60,
            "timed",
            (PY, "-m", "workbench.cli", "compare", *compare),
            None,
            "a calibrated comparison of the base preset needs a GPU's speed",
            key=compare_key,
        ),
        Section(
            "diagnose (bev-perception base, 8 steps)",
            30,
            "timed",
            (
                PY,
                "-m",
                "workbench.cli",
                "diagnose",
                "--workload",
                "bev-perception",
                "--preset",
                "base",
                "--steps",
                "8",
                "--warmup",
                "3",
                "--quiet",
            ),
            None,
            "a profiled base-preset trial needs a GPU's speed",
            key=diagnosis_key,
        ),
    ]


class Check:
    """Runs sections under their caps and the overall budget; writes the folder as it goes."""

    def __init__(self, out: Path, dry_run: bool, budget_s: float, say: Callable[[str], None] = print) -> None:
        self.out, self.dry_run, self.say = out, dry_run, say
        self.began = time.monotonic()
        self.deadline = self.began + budget_s
        self.outcomes: list[Outcome] = []
        self.started = 0
        self.env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(ROOT), PYTHONUNBUFFERED="1")
        # One inductor cache for every section and for a rerun in the same loan (the tests share it too).
        self.env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".inductor-cache"))
        out.mkdir(parents=True, exist_ok=True)

    def run(self, plan: list[Section]) -> int:
        mode = (
            "DRY RUN on this machine's CPU: GPU sections are skipped or run their CPU path" if self.dry_run else "GPU"
        )
        self.say(f"gpu-check ({mode}); logs in {self.out}; budget {self.deadline - self.began:.0f} s")
        for section in plan:
            self.say(f"   plan: [{section.phase}] {section.name} (cap {section.cap_s:.0f} s)")
        for phase in ("setup", "parallel", "timed"):
            group = [s for s in plan if s.phase == phase]
            if phase == "parallel":
                self._together(group)
                continue
            for section in group:
                outcome = self._together([section])[0]
                if section.required and not outcome.ok:
                    self.say(f"== {section.name} failed: the check cannot go on")
                    return self._finish(plan)
        return self._finish(plan)

    def _together(self, group: list[Section]) -> list[Outcome]:
        running: list[_Running] = []
        outcomes: list[Outcome] = []
        for section in group:
            started = self._start(section)
            if isinstance(started, Outcome):
                outcomes.append(started)
            else:
                running.append(started)
        while any(r.outcome is None for r in running):
            for item in running:
                if item.outcome is None:
                    item.outcome = self._poll(item)
                    if item.outcome is not None:
                        self._report(item.outcome)
            time.sleep(0.2)
        outcomes += [r.outcome for r in running if r.outcome is not None]
        self.outcomes += outcomes
        return outcomes

    def _start(self, section: Section) -> _Running | Outcome:
        argv = section.dry_argv if self.dry_run else section.argv
        self.say(f"== [{section.phase}] {section.name} (cap {section.cap_s:.0f} s)")
        if argv is None:
            outcome = Outcome(section.name, section.phase, section.cap_s, f"not on CPU: {section.dry_reason}")
            self._report(outcome)
            return outcome
        left = self.deadline - time.monotonic()
        if left < MIN_START_S:
            outcome = Outcome(section.name, section.phase, section.cap_s,
                              f"skipped: the check's {self.deadline - self.began:.0f} s budget is spent")  # fmt: skip
            self._report(outcome)
            return outcome
        slug = re.sub(r"[^a-z0-9]+", "-", section.name.lower()).strip("-")[:48]
        self.started += 1
        log_path = self.out / f"{self.started:02d}-{slug}.log"
        with log_path.open("wb") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            process = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        return _Running(section, process, log_path, time.monotonic(), min(section.cap_s, left))

    def _poll(self, item: _Running) -> Outcome | None:
        elapsed = time.monotonic() - item.began
        code = item.process.poll()
        if code is None and elapsed < item.cap_s:
            return None
        if code is None:
            _stop_group(item.process)
            status = f"ran out at the {item.cap_s:.0f} s cap"
        else:
            status = "ok" if code == 0 else f"failed (exit {code})"
        text = item.log_path.read_text(errors="replace")
        figure = (item.section.key or default_key)(text) if code == 0 or code is None else _last_line(text)
        return Outcome(item.section.name, item.section.phase, item.cap_s, status, elapsed, figure, str(item.log_path))

    def _report(self, outcome: Outcome) -> None:
        if outcome.log:
            text = Path(outcome.log).read_text(errors="replace").rstrip()
            self.say("\n".join(f"   | {line}" for line in text.splitlines()[-60:]))
        self.say(f"-- {outcome.name}: {outcome.status} ({outcome.seconds:.0f} s) {outcome.key}".rstrip())

    def _finish(self, plan: list[Section]) -> int:
        done = {o.name: o for o in self.outcomes}
        # In the plan's order; a section after a required one that failed never started.
        self.outcomes = [done.get(s.name) or Outcome(s.name, s.phase, s.cap_s, "skipped: not started") for s in plan]
        rows = [(o.name, o.status, f"{o.seconds:.0f}/{o.cap_s:.0f} s", o.key) for o in self.outcomes]
        table = _table(("section", "status", "time/cap", "key figure"), rows)
        total = time.monotonic() - self.began
        failed = [o for o in self.outcomes if not o.ok]
        closing = f"gpu-check{' --dry-run' if self.dry_run else ''}: {len(failed)} section(s) not ok, {total:.0f} s; logs in {self.out}"
        (self.out / "summary.txt").write_text(table + "\n" + closing + "\n")
        (self.out / "summary.json").write_text(json.dumps(
            {"dry_run": self.dry_run, "seconds": total, "sections": [asdict(o) for o in self.outcomes]}, indent=2))  # fmt: skip
        self.say("\n== summary\n" + table + "\n" + closing)
        return 1 if failed else 0


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """End a section and every process it started (trial workers, torchrun ranks, loader workers)."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU needed: every section named with its cap; what a CPU can run, runs (tiny presets)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the logs and summary (default: a new gpu-check-<time> folder in $TMPDIR)")  # fmt: skip
    parser.add_argument(
        "--budget", type=float, default=BUDGET_S, help=f"seconds for the whole check (default {BUDGET_S:g})"
    )
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.gettempdir()) / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    return Check(out, args.dry_run, args.budget).run(sections())


if __name__ == "__main__":
    sys.exit(main())
