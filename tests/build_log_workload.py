"""A workload that logs, per process, when each model's build starts and ends and each forward
call: the truth for how paired workers build (one after another on the CPU) and warm up."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import torch
from sleepy_workload import sleepy_workload
from torch import nn

from workbench.workloads import Workload

BUILD_S = 0.3


def _log(directory: str, *fields: object) -> None:
    with open(Path(directory) / f"{os.getpid()}.log", "a") as out:
        out.write(" ".join(str(f) for f in fields) + "\n")


class LoggedNet(nn.Module):
    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory
        _log(directory, "build-start", time.time())
        time.sleep(BUILD_S)
        self.linear = nn.Linear(4, 1)
        _log(directory, "build-end", time.time())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _log(self.directory, "forward", id(self))
        return self.linear(x)


def build_log_workload(directory: str) -> Workload:
    """`directory`: an empty folder; each process appends to `<pid>.log` there."""
    return replace(sleepy_workload(), model_fn=lambda: LoggedNet(directory), name="build-logged")


def read_logs(directory: str) -> dict[int, list[list[str]]]:
    """pid → its log lines, split into fields."""
    return {int(p.stem): [line.split() for line in p.read_text().splitlines()] for p in Path(directory).glob("*.log")}
