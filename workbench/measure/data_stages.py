"""Where a sample's time goes: the stage times the loader measured, joined to the steps that used them.

The samples' stages (read, decode, transform, or the user's own `wb.stage` markers) and the collate
are timed where they ran — a loader worker or, without workers, the training process — and travel
with the batch (`workloads.stages`). Here each fetched batch is charged to the step that consumed
it (fetch k feeds step k // grad_accumulation: the window fetches in order and nothing else does),
and its host-to-device copy is timed on the device's own clock: CUDA events around the copy, read
after the window, so the timed path never synchronizes. A CPU trial copies nothing to a device: the
copy is "not measured" with that reason, never 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep
    from workbench.measure.result import TrialResult
    from workbench.workloads.stages import BatchStages

COPY = "copy to device"
NO_COPY_ON_CPU = "a CPU trial copies no batch to a device"


class TimedFetches:
    """The trial's batches, each already on the device, with its preparation and copy recorded."""

    def __init__(self, loader: Iterator[Any], train_step: TrainStep) -> None:
        self.loader, self.train_step = loader, train_step
        self.cuda = train_step.device.type == "cuda"
        self.records: list[BatchStages] = []
        self.consumed: list[float] = []
        self.copies: list[Any] = []
        """Per fetch: copy milliseconds (float) or a pair of CUDA events read after the window."""
        self.nbytes: list[int] = []
        """Per fetch: the batch's tensor bytes, all of which a copy to the device moves."""

    def __iter__(self) -> TimedFetches:
        return self

    def __next__(self) -> Any:
        batch, record = next(self.loader)
        self.consumed.append(time.perf_counter())
        self.records.append(record)
        self.nbytes.append(batch_bytes(batch))
        if not self.cuda:
            self.copies.append(None)
            return self.train_step.prepare_batch(batch)
        import torch

        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        batch = self.train_step.prepare_batch(batch)  # the window's own prepare_batch then moves nothing
        ended.record()
        self.copies.append((began, ended))
        return batch

    def summary(self, result: TrialResult) -> dict[str, Any]:
        """Per stage mean and p90 (ms, per sample or per batch), each worker's busy share of the timed
        window, and every timed fetch with its step, its worker and how early it was ready."""
        ga = _micro_batches(result)
        first = result.warmup * ga
        timed = range(first, min(len(self.records), (result.warmup + len(result.step_ms)) * ga))
        window_ms = float(sum(result.step_ms)) or None
        per_sample: dict[str, list[float]] = {}
        for index in timed:
            for sample in self.records[index].samples:
                for name, ms in sample.items():
                    per_sample.setdefault(name, []).append(ms)
        stages = {name: _spread(values, "sample") for name, values in per_sample.items()}
        stages["collate"] = _spread([self.records[i].collate_ms for i in timed], "batch")
        not_measured: dict[str, str] = {}
        copies = [self._copy_ms(i) for i in timed]
        if self.cuda and copies:
            stages[COPY] = _spread([c for c in copies if c is not None], "batch")
        else:
            not_measured[COPY] = NO_COPY_ON_CPU
        busy: dict[str, float] = {}
        for index in timed:
            record = self.records[index]
            key = "main process" if record.worker < 0 else f"worker {record.worker}"
            busy[key] = busy.get(key, 0.0) + (record.ended - record.began) * 1000.0
        fetches = [
            {
                "fetch": index,
                "step": index // ga,
                "worker": self.records[index].worker,
                "prepare_ms": (self.records[index].ended - self.records[index].began) * 1000.0,
                "ready_before_use_ms": max(0.0, (self.consumed[index] - self.records[index].ended) * 1000.0),
                "copy_ms": copies[position],
                "batch_bytes": self.nbytes[index],
            }
            for position, index in enumerate(timed)
        ]
        steps = {index // ga for index in timed}
        copied = sum(self.nbytes[index] for index in timed)
        return {
            "stages": stages,
            "not_measured": not_measured,
            # Capped at 1: a batch used early in the window may have been started just before it.
            "busy_share": {k: min(1.0, v / window_ms) for k, v in busy.items()} if window_ms else {},
            "fetches": fetches,
            "bytes_per_step": copied / len(steps) if steps else None,
        }

    def _copy_ms(self, index: int) -> float | None:
        copy = self.copies[index]
        if copy is None:
            return None
        began, ended = copy
        ended.synchronize()  # after the window: reading the events no longer costs a step anything
        return float(began.elapsed_time(ended))


def batch_bytes(batch: Any) -> int:
    """Bytes of every tensor in a (nested) batch: what moving it to the device copies."""
    from workbench.workloads import map_tensors

    total = 0

    def count(tensor: Any) -> Any:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    map_tensors(batch, count)
    return total


def _micro_batches(result: TrialResult) -> int:
    return int(result.config.get("grad_accumulation", 1) or 1)


def _spread(values: list[float], per: str) -> dict[str, Any]:
    if not values:
        return {"mean_ms": None, "p90_ms": None, "count": 0, "per": per}
    array = np.asarray(values, dtype=float)
    return {"mean_ms": float(array.mean()), "p90_ms": float(np.percentile(array, 90)), "count": len(values), "per": per}


def stages_text(summary: dict[str, Any]) -> str:
    """The breakdown as lines: 'decode  6.10 ms mean  6.40 ms p90  per sample (40)'; 'not measured' named."""
    lines = ["where a batch's time goes (measured where it was prepared):"]
    for name, spread in summary["stages"].items():
        if spread["mean_ms"] is None:
            lines.append(f"  {name:<16} not measured (no batch in the timed window)")
            continue
        lines.append(
            f"  {name:<16} {spread['mean_ms']:8.2f} ms mean {spread['p90_ms']:8.2f} ms p90  per {spread['per']} "
            f"({spread['count']})"
        )
    for name, why in summary["not_measured"].items():
        lines.append(f"  {name:<16} not measured: {why}")
    if summary.get("bytes_per_step") is not None:
        lines.append(f"  batch bytes per step (what a copy to the device moves): {summary['bytes_per_step']:,.0f}")
    for who, share in summary["busy_share"].items():
        lines.append(f"  {who} busy {share:.0%} of the timed window")
    return "\n".join(lines)
