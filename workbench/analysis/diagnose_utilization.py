"""Moved to `workbench.analysis.detectors.utilization` (a detector in the diagnosis's registry)."""

from workbench.analysis.detectors.utilization import (
    CONTENDED_SHARE,
    DATA_WAIT_SHARE,
    LOW_GPU_UTIL_PCT,
    OTHER_BUSY_CORES,
    SHORT_STEP_MS,
    utilization_findings,
    utilization_notes,
)
from workbench.moved import warn_moved

warn_moved(__name__, "workbench.analysis.detectors.utilization")

__all__ = [
    "CONTENDED_SHARE",
    "DATA_WAIT_SHARE",
    "LOW_GPU_UTIL_PCT",
    "OTHER_BUSY_CORES",
    "SHORT_STEP_MS",
    "utilization_findings",
    "utilization_notes",
]
