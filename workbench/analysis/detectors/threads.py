"""CPU oversubscribed: more runnable threads than cores.

Reads the intra-op threads the trial resolved (`applied`), its ranks per host and loader workers,
against the cores it may use. Every operator's threads wait for the slowest one, and step times
swing with whatever else runs (57 ms to 2.4 s for one ViT step seen on 2 cores).
"""

from __future__ import annotations

from workbench.analysis.advice import Context, Recommendation
from workbench.analysis.detectors.base import Detector, Evidence
from workbench.analysis.findings import Finding


def find(ev: Evidence) -> list[Finding]:
    # Imported here: levers.threads imports torch, and the diagnosis imports without it (the
    # JupyterLab server extension reads stored results in a process that never loads torch).
    from workbench.levers.threads import resolved_intra_op_threads

    ctx = ev.ctx
    threads = resolved_intra_op_threads(ev.result.applied)
    if threads is None:
        return []
    processes = ctx.config.nproc_per_node if ctx.config.launches_ranks else 1  # ranks sharing this host
    loaders = ctx.config.num_workers * processes  # PyTorch runs each loader worker on one thread
    demand = threads * processes + loaders
    if demand <= ctx.cpu_cores:
        return []
    fit = max(1, ctx.cpu_cores // processes - ctx.config.num_workers)
    finding = Finding(
        kind="threads",
        severity="bottleneck" if ctx.device_type == "cpu" else "info",
        title="CPU oversubscribed",
        summary=f"{threads} intra-op thread(s) x {processes} process(es) + {loaders} loader worker(s) = {demand} "
        f"busy threads on {ctx.cpu_cores} core(s)",
        evidence={
            "intra_op_threads": threads,
            "processes": processes,
            "loader_workers": loaders,
            "cpu_cores": ctx.cpu_cores,
        },
        score=0.5 * (1.0 - ctx.cpu_cores / demand),
        recommendations=for_threads(ctx, fit, demand),
    )
    return [finding]


def for_threads(ctx: Context, fit: int, demand: int) -> list[Recommendation]:
    return ctx.offer(
        [
            Recommendation(
                f"Use {fit} intra-op thread(s) per process",
                {"intra_op_threads": fit},
                f"{demand} busy threads shrink to at most {ctx.cpu_cores}: steadier steps, often faster ones",
                "threads beyond the cores time-share them, and an operator waits for its slowest thread",
            )
        ]
    )


DETECTOR = Detector(
    name="threads",
    reads="the resolved intra-op threads, ranks per host and loader workers against the CPU cores",
    find=find,
)
