"""Moved: `Recommendation` and `Context` to `workbench.analysis.advice`; each finding's advice
(`for_data`, `for_overhead`, ...) to its detector in `workbench.analysis.detectors`."""

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.data import for_data
from workbench.analysis.detectors.kernels import for_bandwidth, for_compute
from workbench.analysis.detectors.memory import for_memory
from workbench.analysis.detectors.overhead import for_overhead
from workbench.analysis.detectors.syncs import for_syncs
from workbench.analysis.detectors.threads import for_threads
from workbench.moved import warn_moved

warn_moved(__name__, "workbench.analysis.advice (Recommendation, Context) and workbench.analysis.detectors")

__all__ = [
    "Context",
    "Recommendation",
    "for_bandwidth",
    "for_compute",
    "for_data",
    "for_memory",
    "for_overhead",
    "for_syncs",
    "for_threads",
]
