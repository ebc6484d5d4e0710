"""A workload with a known per-worker bias: in each process, one of the two identical models it
builds sleeps 30% longer per step — the first-built in an even-numbered worker, the second in an
odd-numbered one. It stands for what a real worker does to identical configurations (memory
layout, thread placement), with a truth the test knows: A/A, biased one way or the other by worker."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import torch
from sleepy_workload import sleepy_workload
from torch import nn

from workbench.workloads import Workload

SLEEP_S = 0.010
BIAS = 1.3


_claimed: dict[int, int] = {}
"""Per process (keyed by pid, so a forked or spawned child never inherits its parent's): its
worker number, then how many models it has built."""
_built: dict[int, int] = {}


def _worker_number(directory: str) -> int:
    """This process's number, claimed once: the lowest `worker-N` file it could create."""
    pid = os.getpid()
    if pid not in _claimed:
        number = 0
        while True:
            try:
                os.close(os.open(Path(directory) / f"worker-{number}", os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                number += 1
        _claimed[pid] = number
    return _claimed[pid]


class WorkerBiasedNet(nn.Module):
    def __init__(self, directory: str, fail_odd_paired: bool = False) -> None:
        super().__init__()
        worker = _worker_number(directory)
        instance = _built.get(os.getpid(), 0)
        _built[os.getpid()] = instance + 1
        if fail_odd_paired and instance == 1 and worker % 2:  # a second model in one process: a paired worker
            raise RuntimeError("simulated: out of memory with both models resident")
        self.sleep_s = SLEEP_S * (BIAS if instance == worker % 2 else 1.0)
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return self.linear(x)


def worker_biased_workload(directory: str, fail_odd_paired: bool = False) -> Workload:
    """`directory`: an empty folder where the workers claim their numbers. `fail_odd_paired`: an
    odd-numbered process fails building its second model (a paired worker out of memory)."""
    return replace(
        sleepy_workload(), model_fn=lambda: WorkerBiasedNet(directory, fail_odd_paired), name="worker-biased"
    )
