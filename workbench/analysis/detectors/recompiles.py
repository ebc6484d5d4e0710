"""Recompiles: dynamo compiling the model again because a guard failed, with the config or code fix.

Reads the compile report's recompiles (`TrialResult.compile_report['recompiles']`: the failed guard
in words, its kind, when it happened) against the timed window. A size guard ("dim 0 of `x` changed
4 → 6") has a toggle: compile for dynamic shapes (the compile lever's `compile_dynamic`); a value
guard (a Python number read from a tensor) needs a code change, and each new value compiles again
until dynamo's recompile limit sends the frame back to eager. A recompile inside the timed window
is in its step times (a bottleneck); one during warm-up costs compile time only.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.detectors.graph_breaks import short
from workbench.analysis.findings import Finding


def find(ev: Evidence) -> list[Finding]:
    recompiles: list[dict[str, Any]] = list((ev.result.compile_report or {}).get("recompiles") or [])
    if not recompiles:
        return []
    window = ev.result.timed_window or [float("inf"), float("inf")]
    timed = [r for r in recompiles if window[0] <= float(r.get("started_at") or 0.0) <= window[1]]
    kinds = sorted({r["kind"] for r in recompiles})
    first = recompiles[0]
    what = "on every new input shape" if kinds == ["size"] else "when a guarded value changes"
    during = f"; {len(timed)} inside the timed window, in its step times" if timed else " (all during warm-up)"
    summary = (
        f"recompiling {what}: {len(recompiles)} recompile(s) of {first['function']} at {short(first['where'])} "
        f"({first['words']}){during}"
    )
    finding = Finding(
        kind="compile",
        severity="bottleneck" if timed else "info",
        title="Recompiles",
        summary=summary,
        evidence={"recompiles": len(recompiles), "in_timed_window": len(timed), "kinds": kinds, "events": recompiles},
        score=(0.5 if timed else 0.05) * len(recompiles) / (len(recompiles) + 1),  # an ordering only
        recommendations=_fixes(ev.ctx, recompiles),
    )
    return [finding]


def _fixes(ctx: Context, recompiles: list[dict[str, Any]]) -> list[Recommendation]:
    recs: list[Recommendation] = []
    sizes = [r for r in recompiles if r["kind"] == "size"]
    if sizes:
        recs.append(
            Recommendation(
                "Compile for dynamic shapes",
                {"compile_dynamic": True},
                "one graph serves every size: no compile per new shape (a dynamic graph may run a little slower "
                "than a graph specialized to one size)",
                f"the guard on the input's size failed ({sizes[0]['words']}); compile_dynamic=True traces sizes "
                "as symbols (in code: `torch._dynamo.mark_dynamic(x, dim)` on that input)",
            )
        )
        recs.append(
            Recommendation(
                "Pad the inputs to a few fixed sizes (buckets)",
                {},
                "one specialized graph per bucket, compiled once each",
                "where only a few sizes occur (sequence lengths, image sizes), padding keeps every graph static "
                "and fast; the data loader's collate function is the place",
            )
        )
    for event in [r for r in recompiles if r["kind"] != "size"][:2]:
        recs.append(
            Recommendation(
                f"Stop the recompile at {short(event['where'])}",
                {},
                "compiled once instead of once per new value",
                f"{event['words']}: {event['fix']}",
            )
        )
    return ctx.offer(recs)


DETECTOR = Detector(
    name="recompiles",
    reads="a compiled trial's compile report: each recompile's failed guard and time, against the timed window",
    find=find,
)
