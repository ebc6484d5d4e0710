"""Distributed trials: synchronization bound, a straggler rank, or a busy host — registered here.

The rule lives in `analysis.ranks` (and `analysis.stragglers`, shared with watched jobs); this
module only places it in the diagnosis. It reads `TrialResult.distributed` (every rank's timeline).
It supersedes rank 0's own data-bound finding when the straggler is late because of its data:
the straggler's finding carries that advice for the rank it names (rank 0's phases would say it
again without naming a rank).
"""

from __future__ import annotations

from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding
from workbench.analysis.ranks import distributed_findings, distributed_notes


def find(ev: Evidence) -> list[Finding]:
    found = distributed_findings(ev.result)
    if any(f.kind == "distributed" and f.evidence.get("cause") == "data" for f in found):
        ev.findings[:] = [f for f in ev.findings if f.kind != "data"]
    return found


def notes(ev: Evidence) -> list[str]:
    return distributed_notes(ev.result)


DETECTOR = Detector(
    name="ranks",
    reads="a distributed trial's per-rank timelines, communication figures and host loads",
    find=find,
    notes=notes,
)
