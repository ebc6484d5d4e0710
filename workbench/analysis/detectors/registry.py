"""`DETECTORS`: every detector, in the one order `diagnose` runs them.

The order, and why (findings are sorted by severity and score afterwards, so it matters only
where one detector reads another's finding, for ties, and for the order of the notes):
1-6. the single-process readings, each on its own evidence: data, overhead, syncs, memory,
     threads, kernels.
7. ranks after the data detector, whose rank-0 finding it supersedes when a straggler is late
   for its data.
8. utilization after data, overhead and ranks: it corroborates their findings (or, where they
   made none, makes its own), so it must see them, pruned.
9-10. graph breaks and recompiles read only the compile report; last, so the notes of the
   detectors above keep their order.
"""

from __future__ import annotations

from workbench.analysis.detectors import (
    data,
    graph_breaks,
    kernels,
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
    syncs.DETECTOR,
    memory.DETECTOR,
    threads.DETECTOR,
    kernels.DETECTOR,
    ranks.DETECTOR,
    utilization.DETECTOR,
    graph_breaks.DETECTOR,
    recompiles.DETECTOR,
)


def detector(name: str) -> Detector:
    """The registered detector called `name`."""
    for item in DETECTORS:
        if item.name == name:
            return item
    raise KeyError(f"no detector is called {name!r}")
