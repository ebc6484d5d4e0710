"""Graph breaks: where dynamo stopped capturing the model's forward, and the code change that removes each.

Reads the compiled trial's compile report (`TrialResult.compile_report['breaks']`, one per break
site with PyTorch's own type, explanation, hint and page, and the user's file:line). Every break
ends one graph and starts another: no fusion across it, and the step returns to Python there; on a
GPU, each one also stops CUDA graphs. No toggle removes a break, so the advice is a code change at
its line (its score only orders it among the findings: the report cannot time a break).
"""

from __future__ import annotations

import os
from typing import Any

from workbench.analysis.advice import Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding

#: The advice per break class: what to change at the line.
CHANGES = {
    "data-dependent": "keep the value on the device (no `.item()`/`.tolist()`/`bool(tensor)` in forward); branch "
    "with `torch.where` or `torch.cond`, or read it outside the compiled model",
    "explicit": "remove the `torch._dynamo.graph_break()` call",
    "print/logging": "move the print or logging out of forward (or log every N steps, outside the compiled model)",
    "skipped function": "call a function dynamo traces (plain torch ops), or wrap the call as a custom op",
    "unsupported": "rewrite that line with plain torch ops",
    "other": "follow PyTorch's hint for this break",
}


def find(ev: Evidence) -> list[Finding]:
    report = ev.result.compile_report or {}
    breaks: list[dict[str, Any]] = list(report.get("breaks") or [])
    if not breaks:
        return []
    first = breaks[0]
    classes = sorted({b["reason_class"] for b in breaks})
    summary = (
        f"{len(breaks)} graph break(s) split the compiled forward into {report.get('graphs', 0)} graphs; the first "
        f"at {short(first['where'])} (`{first.get('code') or first['function']}` — {first['reason_class']}: "
        f"{first['reason']})"
    )
    finding = Finding(
        kind="compile",
        severity="bottleneck",
        title="Graph breaks",
        summary=summary,
        evidence={"breaks": len(breaks), "graphs": report.get("graphs"), "classes": classes, "sites": breaks},
        score=0.3 * len(breaks) / (len(breaks) + 1),  # an ordering only: more breaks, more lost fusion
        recommendations=ev.ctx.offer([_remove(b) for b in breaks[:3]]),
    )
    return [finding]


def notes(ev: Evidence) -> list[str]:
    report = ev.result.compile_report
    return [f"compile report: {report['note']}"] if report and report.get("note") else []


def _remove(brk: dict[str, Any]) -> Recommendation:
    page = f" ({brk['url']})" if brk.get("url") else ""
    hint = f" PyTorch's hint: {brk['hints'][0]}" if brk.get("hints") else ""
    return Recommendation(
        f"Remove the graph break at {short(brk['where'])}",
        {},
        "one graph where there were two: the compiler fuses across that line and the step no longer returns to "
        "Python there",
        f"{brk['reason']}{page}: {CHANGES.get(brk['reason_class'], CHANGES['other'])}.{hint}",
    )


def short(where: str) -> str:
    """'model.py:42' from a full path: the file's name is what a reader finds in their editor."""
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else where


DETECTOR = Detector(
    name="graph-breaks",
    reads="a compiled trial's compile report: each graph break's type, reason class and file:line",
    find=find,
    notes=notes,
)
