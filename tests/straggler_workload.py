"""A data-parallel workload with a known fault on one rank: a fixed sleep in its data loading, forward,
backward or optimizer step. The rank is read from torchrun's RANK when the fault fires, so the same
workload runs everywhere and only that rank is slowed — the truth a straggler verdict must name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from workbench.workloads import Workload

PHASES = ("data", "forward", "backward", "optimizer")


def _slowed(rank: int) -> bool:
    return os.environ.get("RANK") == str(rank)


class _SlowBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps (on the slowed rank): a backward that is late by itself."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, delay_s: float) -> torch.Tensor:
        ctx.delay_s = delay_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.delay_s)
        return grad, None


class FaultyNet(nn.Module):
    def __init__(
        self, phase: str, rank: int, delay_s: float, width: int = 256, norm: bool = False, device_s: float = 0.0
    ) -> None:
        super().__init__()
        self.device_s = device_s  # every rank: a host waiting this long for its GPU's forward
        self.first, self.second = nn.Linear(64, width), nn.Linear(width, 1)
        # BatchNorm's buffers make DDP broadcast them at every forward's entry: a second synchronization
        self.norm = nn.BatchNorm1d(width) if norm else nn.Identity()
        self.forward_delay = delay_s if phase == "forward" and _slowed(rank) else 0.0
        self.backward_delay = delay_s if phase == "backward" and _slowed(rank) else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_delay or self.device_s:
            time.sleep(self.forward_delay + self.device_s)
        hidden = torch.relu(self.norm(self.first(x)))
        if self.backward_delay:
            hidden = _SlowBackward.apply(hidden, self.backward_delay)
        return self.second(hidden)


def straggler_workload(
    phase: str | None,
    rank: int = 1,
    delay_s: float = 0.03,
    width: int = 256,
    batch_size: int = 12,
    norm: bool = False,
    device_s: float = 0.0,
) -> Workload:
    """`phase` None: no fault anywhere (the no-straggler truth); `width` and `batch_size` set the step's size."""
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES} or None, got {phase!r}")

    def model_fn() -> nn.Module:
        if phase == "optimizer" and _slowed(rank):
            register_optimizer_step_pre_hook(lambda *_: time.sleep(delay_s))  # every optimizer of this rank
        return FaultyNet(str(phase), rank, delay_s, width, norm, device_s)

    def batch_fn(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if phase == "data" and _slowed(rank):
            time.sleep(delay_s)
        return torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g)

    return Workload.from_callables(
        model_fn=model_fn,
        batch_fn=batch_fn,
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=batch_size,
        name=f"faulty-{phase or 'none'}",
    )


# A user's own DDP loop under `wb.watch`, run by torchrun: each spec `phase:slow:delay_s[:norm]` is one
# watched job (named `phase-slow[-norm]`), run one after another in one launch so the start-up is paid once.
WATCHED_JOB = """
import sys, time, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
import workbench as wb
from straggler_workload import FaultyNet

dist.init_process_group("gloo")
rank = dist.get_rank()
store, width, batch, steps, device = sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
for spec in sys.argv[7:]:
    phase, slow, delay, *flags = spec.split(":")
    slowed, delay = rank == int(slow), float(delay)
    torch.manual_seed(0)
    net = FaultyNet(phase, int(slow), delay, width, "norm" in flags, device)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loader(n):
        for _ in range(n):
            if phase == "data" and slowed:
                time.sleep(delay)
            yield torch.randn(batch, 64)

    with wb.watch(model, opt, name="-".join([phase, slow, *flags]), store=store, warmup=3, flush_s=0.2) as w:
        if phase == "optimizer" and slowed:  # after the watch's own hook: inside the optimizer phase
            opt.register_step_pre_hook(lambda *_: time.sleep(delay))
        for x in w.batches(loader(steps + 3)):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss=loss)
    dist.barrier()
dist.destroy_process_group()
"""


def launch_watched(
    directory: Path,
    world: int,
    specs: list[str],
    *,
    width: int = 256,
    batch: int = 64,
    steps: int = 21,
    device_s: float = 0.0,
) -> Path:
    """Run the watched jobs `specs` on `world` gloo ranks; returns the run history they wrote."""
    root = Path(__file__).resolve().parents[1]
    store, script = directory / "history.db", directory / "job.py"
    script.write_text(textwrap.dedent(WATCHED_JOB))
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    command += [
        str(script),
        str(store),
        str(Path(__file__).parent),
        str(width),
        str(batch),
        str(steps),
        str(device_s),
        *specs,
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, cwd=directory)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return store


@contextmanager
def cpu_burners(count: int) -> Iterator[None]:
    """`count` processes spinning on the CPU for as long as the block runs: a busy host."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
