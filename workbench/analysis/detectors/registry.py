"""`DETECTORS`: every detector, in the one order `diagnose` runs them.

The order, and why (findings are sorted by severity and score afterwards, so it matters only
where one detector reads another's finding, for ties, and for the order of the notes):
1-2. data, overhead: single-process readings, each on its own evidence.
3. launch-bound right after overhead: for a compiled trial it supersedes the overhead finding
   (whose first fix, compile, is already on) before anything reads it.
4-7. syncs, memory, threads, kernels: single-process readings, each on its own evidence.
8. ranks after the data detector, whose rank-0 finding it supersedes when a straggler is late
   for its data.
9. utilization after data, overhead and ranks: it corroborates their findings (or, where they
   made none, makes its own), so it must see them, pruned.
10-12. graph breaks, recompiles and compile payback read only the compile report and compile
   times; last, so the notes of the detectors above keep their order.
"""

from __future__ import annotations

from workbench.analysis.detectors import (
    compile_payback,
    data,
    graph_breaks,
    kernels,
    launch_bound,
    memory,
    overhead,
    ranks,
    recompiles,
    syncs,
    threads,
    utilization,
)
from workbench.analysis.detectors.base import Detector

DETECTORS: tuple[Detector, ...] = (
    data.DETECTOR,
    overhead.DETECTOR,
    launch_bound.DETECTOR,
    syncs.DETECTOR,
    memory.DETECTOR,
    threads.DETECTOR,
    kernels.DETECTOR,
    ranks.DETECTOR,
    utilization.DETECTOR,
    graph_breaks.DETECTOR,
    recompiles.DETECTOR,
    compile_payback.DETECTOR,
)


def detector(name: str) -> Detector:
    """The registered detector called `name`."""
    for item in DETECTORS:
        if item.name == name:
            return item
    raise KeyError(f"no detector is called {name!r}")
