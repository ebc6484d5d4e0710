"""The compile counts of a watched job: graphs, graph breaks and recompiles of what the user compiled.

Read on the writer's thread at every flush from dynamo's own records (`measure.compile_report`'s
`CompileWatch`, the same reading a compiled trial's report makes), never on the training thread.
Dynamo keeps only its last 64 frame-compile records, so each flush adds what it reads to running
sets: a recompile seen once stays counted in a long job (recompiles there are a classic silent
slowdown). A job that compiled nothing has no compile entry.
"""

from __future__ import annotations

from typing import Any

from workbench.measure.compile_report import CompileWatch

#: Sites and guards kept in the stored summary (the counts cover them all).
SHOWN = 3


class CompileCounts:
    """Running graph, break and recompile counts since the watch began."""

    def __init__(self) -> None:
        self.watch = CompileWatch()
        self.graphs = 0
        self.breaks: dict[tuple[str, str], dict[str, Any]] = {}
        self.recompiles: dict[tuple[str, str, float], dict[str, Any]] = {}
        self.note = ""

    def summary(self) -> dict[str, Any] | None:
        """The counts so far as plain data for the run's summary; None while nothing was compiled."""
        report = self.watch.report()  # never raises: a record it cannot read is in its note
        self.note = report.note
        self.graphs = max(self.graphs, report.graphs)
        for brk in report.breaks:
            self.breaks.setdefault((brk["where"], brk["reason"]), brk)
        for event in report.recompiles:
            self.recompiles.setdefault((event["function"], event["where"], event["started_at"]), event)
        if not (self.graphs or self.breaks or self.recompiles or report.frames):
            return None
        return {
            "graphs": self.graphs,
            "graph_breaks": len(self.breaks),
            "recompiles": len(self.recompiles),
            "break_sites": [
                {k: b[k] for k in ("where", "code", "reason", "reason_class")}
                for b in list(self.breaks.values())[:SHOWN]
            ],
            "recompile_guards": [
                {k: r[k] for k in ("function", "where", "words", "kind")}
                for r in list(self.recompiles.values())[:SHOWN]
            ],
            "note": self.note,
        }


def start_compile_counts() -> CompileCounts | None:
    """Counts from now on, or None where this torch cannot give them (the job runs on unwatched)."""
    try:
        return CompileCounts()
    except Exception:  # a private API moved: the watch must never fail the job for it
        return None
