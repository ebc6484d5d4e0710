"""A configuration's utilization and energy across its trials, and a candidate's change against the baseline.

Pure functions over `TrialResult.utilization` / `.energy` (the timed window's figures, see
`workbench.measure.utilization`), flattened to one number per figure so a table, the JSON
and the diagnosis read the same keys. Over several trials of one configuration each figure
is the median of the trials' (the process is the unit, as for step time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.measure.result import TrialResult

FIGURES = (
    "cpu_cores_used",
    "cpu_cores_available",
    "cpu_util_pct",
    "host_pct",
    "other_cores",
    "gpu_util_pct",
    "gpu_mem_util_pct",
    "sm_clock_mhz",
    "gpu_mem_used_bytes",
    "energy_per_step_j",
    "energy_per_sample_j",
)
"""The headline figures, each a number or None (GPU figures on a CPU, energy without a counter)."""


def headline(result: TrialResult) -> dict[str, float | None]:
    """One trial's window figures, flat: CPU means, GPU medians, energy per step and per sample."""
    util = result.utilization or {}
    cpu, gpu, energy = util.get("cpu") or {}, util.get("gpu") or {}, result.energy or {}
    available = energy.get("available", False)
    return {
        "cpu_cores_used": cpu.get("cores_used"),
        "cpu_cores_available": cpu.get("cores_available"),
        "cpu_util_pct": cpu.get("util_pct"),
        "host_pct": cpu.get("host_pct"),
        "other_cores": cpu.get("other_cores"),
        "gpu_util_pct": _median(gpu.get("util_pct")),
        "gpu_mem_util_pct": _median(gpu.get("mem_util_pct")),
        "sm_clock_mhz": _median(gpu.get("sm_clock_mhz")),
        "gpu_mem_used_bytes": _median(gpu.get("mem_used_bytes")),
        "energy_per_step_j": energy.get("per_step_j") if available else None,
        "energy_per_sample_j": energy.get("per_sample_j") if available else None,
    }


def summarize_utilization(runs: Sequence[TrialResult]) -> dict[str, Any] | None:
    """Each figure's median over the trials that have it (None when no trial recorded any), and
    why energy is missing (the first trial's reason)."""
    recorded = [r for r in runs if r.utilization is not None]
    if not recorded:
        return None
    rows = [headline(r) for r in recorded]
    summary: dict[str, Any] = {}
    for key in FIGURES:
        values = [value for row in rows if (value := row[key]) is not None]
        summary[key] = float(np.median(values)) if values else None
    if summary["energy_per_step_j"] is None:
        summary["energy_reason"] = next(((r.energy or {}).get("reason", "") for r in recorded), "")
    return summary


def utilization_delta(base: dict[str, Any] | None, cand: dict[str, Any] | None) -> dict[str, float | None] | None:
    """Candidate minus baseline, figure by figure (None where either lacks it)."""
    if base is None or cand is None:
        return None
    return {key: None if base.get(key) is None or cand.get(key) is None else cand[key] - base[key] for key in FIGURES}


def _median(figures: dict[str, float] | None) -> float | None:
    return None if not figures else figures.get("median")
