"""`workbench tune --workers N`: N tuner processes on this machine joining one shared study.

Each is the same `workbench tune` command without `--workers`: on a node with GPUs, one per GPU
(`CUDA_VISIBLE_DEVICES` names its own); on a CPU, N processes (for trying it, and for the tests).
The processes coordinate through the study alone, so a worker on another machine started with the
same `--storage` and `--study` is no different from these.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from workbench.cli.options import UsageError

#: Seconds between two workers' starts: the first takes the baseline, the others queue for it anyway.
STAGGER_S = 0.5


def run_workers(argv: Sequence[str], workers: int, *, as_json: bool) -> int:
    """Start `workers` copies of `workbench tune ARGV`, pass their progress through, print each result."""
    gpus = _visible_gpus()
    if gpus and workers > len(gpus):
        raise UsageError(f"--workers {workers} but this node has {len(gpus)} GPU(s): at most one worker per GPU")
    procs = []
    for index in range(workers):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[index]
        command = [sys.executable, "-m", "workbench.cli", "tune", *argv]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
        if index + 1 < workers:
            import time

            time.sleep(STAGGER_S)
    outputs = [proc.communicate()[0] for proc in procs]
    codes = [proc.returncode for proc in procs]
    if as_json:
        print(json.dumps([_json_or_text(out) for out in outputs], indent=2))
    else:
        for index, (out, code) in enumerate(zip(outputs, codes)):
            print(f"--- worker {index + 1} of {workers} (exit {code}) ---\n{out.rstrip()}")
    return max(codes, key=abs)


def strip_workers(argv: Sequence[str]) -> list[str]:
    """The command line without `--workers N` / `--workers=N`."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            kept.append(arg)
    return kept


def _visible_gpus() -> list[str]:
    """The GPUs this process may use (their CUDA_VISIBLE_DEVICES entries); [] without CUDA."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g for g in listed.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except ImportError:
        return []


def _json_or_text(out: str) -> object:
    try:
        return json.loads(out)
    except ValueError:
        return {"output": out}
