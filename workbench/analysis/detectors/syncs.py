"""Host-device synchronization: calls that make the host wait for the device, with their source lines.

Reads the profiled window's sync scan (`profile['syncs']`): per-step count and the sites. On CPU
they cost nothing now but rule out CUDA graphs on a GPU; the fix is a code change at each line
(or bf16 instead of fp16, whose GradScaler checks for infs every step).
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding


def find(ev: Evidence) -> list[Finding]:
    ctx = ev.ctx
    syncs = ev.profile.get("syncs") or {}
    per_step = syncs.get("per_step")
    if not per_step or per_step < 1:
        return []
    sites = list(syncs.get("sites") or [])
    where = "; ".join(f"{s['count']:g}× {s['op']} at {s['source']}" for s in sites[:3])
    cost = (
        "each one stalls the launch queue until the GPU catches up"
        if ctx.device_type == "cuda"
        else "on this CPU they cost nothing, but on a GPU each one stalls the launch queue"
    )
    finding = Finding(
        kind="sync",
        severity="bottleneck",
        title="Host-device synchronization",
        summary=f"{per_step:g} host-synchronizing call(s) per step ({where}); {cost}, and they rule out CUDA graphs",
        evidence={"syncs_per_step": per_step, "sites": sites},
        score=0.5 if ctx.device_type == "cuda" else 0.1,
        recommendations=for_syncs(ctx, sites),
    )
    return [finding]


def notes(ev: Evidence) -> list[str]:
    error = (ev.profile.get("syncs") or {}).get("error")
    return [f"sync scan failed: {error}"] if error else []


def for_syncs(ctx: Context, sites: list[dict[str, Any]]) -> list[Recommendation]:
    recs: list[Recommendation] = []
    if any("grad_scaler" in str(site.get("via", "")) for site in sites):
        recs.append(
            Recommendation(
                "Train in bf16 instead of fp16",
                {"amp": "bf16"},
                "removes the GradScaler's per-step inf check, the sync it causes",
                "bf16 has fp32's exponent range, so it needs no loss scaling",
            )
        )
    for site in sites:
        if "grad_scaler" in str(site.get("via", "")):
            continue
        recs.append(
            Recommendation(
                f"Remove the host read at {site['source']}",
                {},
                f"{site['count']:g} fewer host waits per step; on a GPU each one drains the launch queue",
                f"`{site.get('code') or site['op']}` makes the host wait for the device ({site['op']}); keep the "
                "value on the device, or read it every N steps",
            )
        )
    return ctx.offer(recs)


DETECTOR = Detector(
    name="syncs",
    reads="the profiled window's sync scan: host-synchronizing calls per step and their source lines",
    find=find,
    notes=notes,
)
