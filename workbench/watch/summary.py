"""A watched run's running summary (written with every flush) and the device monitor's window figures.

The writer adds to it what only it can know, one resolved step at a time: `first_nonfinite_loss_step`
(the first step whose loss was NaN or infinite, None while none was), and at a failed end, `failure`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, cast

from workbench.analysis.steady import steady_rows, steady_step_ms, weighted_quantile
from workbench.analysis.stragglers import PHASES
from workbench.measure.monitor import Sample
from workbench.store.watched import StepRow
from workbench.watch.steps import StepHistory


def run_summary(rows: Sequence[StepRow], warmup: int, history: StepHistory, window: dict[str, Any],
                energy_j: float | None, dropped_steps: int, dropped_writes: int) -> dict[str, Any]:  # fmt: skip
    median, iqr = steady_step_ms(rows, warmup)
    last = history.recent[-1] if history.recent else None
    return {
        "steady_median_ms": median,
        "steady_iqr_ms": iqr,
        # the phases' steady medians: across the ranks of one job, where their times part (rank skew)
        **{f"steady_{phase}_ms": steady_phase_ms(rows, warmup, phase) for phase in PHASES},
        "steady_stages_ms": steady_stages_ms(rows, warmup),
        "stride": history.stride,
        "last_loss": last.loss if last is not None else None,
        "peak_memory_bytes": max((r.peak_memory_bytes for r in rows if r.peak_memory_bytes is not None), default=None),
        "window": window,
        "energy_j": energy_j,
        "dropped_steps": dropped_steps,
        "dropped_writes": dropped_writes,
    }


def steady_phase_ms(rows: Sequence[StepRow], warmup: int, phase: str) -> float | None:
    """The median of one phase's time (`data`, `forward`, ...) over the steady steps that saw it."""
    kept = [r for r in steady_rows(rows, warmup) if getattr(r, f"{phase}_ms") is not None]
    if not kept:
        return None
    return weighted_quantile([getattr(r, f"{phase}_ms") for r in kept], [r.steps for r in kept], 0.5)


def steady_stages_ms(rows: Sequence[StepRow], warmup: int) -> dict[str, float]:
    """Per stage the job's Dataset marked (`wb.stage`): the median of its ms per step over the steady
    steps that measured it; a stage never marked is absent (not measured), never 0."""
    kept = [(r.stages, r.steps) for r in cast("list[StepRow]", steady_rows(rows, warmup)) if r.stages]
    names = sorted({name for stages, _ in kept for name in stages})
    return {
        name: weighted_quantile(
            [stages[name] for stages, _ in kept if name in stages], [n for stages, n in kept if name in stages], 0.5
        )
        for name in names
    }


def window_utilization(samples: Sequence[Sample]) -> dict[str, Any]:
    """Mean host and GPU utilization over the samples, and the GPUs' energy (power × time) over them."""
    if not samples:
        return {}
    cpu = [s["host"]["cpu_pct"] for s in samples]
    gpu = [g["util_pct"] for s in samples for g in s["gpus"] if g["util_pct"] is not None]
    energy = None
    for before, after in itertools.pairwise(samples):
        power = [g["power_w"] for g in after["gpus"] if g["power_w"] is not None]
        if power:
            energy = (energy or 0.0) + sum(power) * (after["t"] - before["t"])
    return {
        "start": samples[0]["t"],
        "end": samples[-1]["t"],
        "cpu_pct": sum(cpu) / len(cpu),
        "gpu_util_pct": sum(gpu) / len(gpu) if gpu else None,
        "energy_j": energy,
    }
