"""Recommendations: a config change with its expected effect and the reason, ranked per finding.

Each one is checked against the trial's own capabilities table (recorded in the result) and
against `TrainConfig` validation before it is offered, so `apply()` returns a config that
can run on the device the trial ran on. Some advice is a code change no toggle can make
(an `.item()` in the model); those carry no changes and `apply()` refuses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workbench.config import ConfigError, TrainConfig


@dataclass
class Recommendation:
    title: str
    changes: dict[str, Any]
    """Config fields to set ({} for advice that needs a code change)."""
    expected: str
    """The expected effect, with numbers where the evidence gives them."""
    why: str
    rank: int = 0
    """1 = try first, within its finding."""

    @property
    def actionable(self) -> bool:
        return bool(self.changes)

    def apply(self, config: TrainConfig, device: Any = None) -> TrainConfig:
        """The candidate config; with `device`, also checked against what that device can run."""
        if not self.changes:
            raise ConfigError(f"'{self.title}' is a code change, not a config toggle; see its note: {self.why}")
        changes = dict(self.changes)
        if "extra" in changes:
            changes["extra"] = {**config.extra, **changes["extra"]}
        candidate = config.replace(**changes)
        if device is not None:
            from workbench.levers import check_config

            check_config(candidate, device)
        return candidate

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "changes": dict(self.changes),
            "expected": self.expected,
            "why": self.why,
            "rank": self.rank,
            "actionable": self.actionable,
        }


@dataclass
class Context:
    """What the recommenders need to know about the trial, read once from its result."""

    config: TrainConfig
    device_type: str
    cpu_cores: int
    capabilities: dict[str, dict[str, Any]]
    step_ms: float
    phase_ms: dict[str, float] = field(default_factory=dict)
    batch_size: int = 0
    optimizer_impl: str = ""
    """The optimizer implementation the trial ran (optimizer_impl='default' resolved); '' if unrecorded."""
    sync_sites: list[dict[str, Any]] = field(default_factory=list)
    """Host-synchronizing calls the profile's sync scan found in one step ({op, source, code, ...})."""

    def available(self, name: str, value: Any) -> bool:
        table = self.capabilities.get(name)
        if not table:
            return True
        key = str(value).lower() if isinstance(value, bool) else str(value)
        entry = table.get(key)
        return entry is None or bool(entry.get("available", True))

    def offer(self, candidates: list[Recommendation]) -> list[Recommendation]:
        """Keep the ones that change something, can run here and validate; rank in the given order."""
        kept: list[Recommendation] = []
        for rec in candidates:
            if rec.changes:
                if all(getattr(self.config, k) == v for k, v in rec.changes.items() if k != "extra"):
                    continue
                if not all(self.available(k, v) for k, v in rec.changes.items()):
                    continue
                try:
                    rec.apply(self.config)
                except ConfigError:
                    continue
            rec.rank = len(kept) + 1
            kept.append(rec)
        return kept


# --- per finding ------------------------------------------------------------------------------


def for_data(ctx: Context, data_ms: float) -> list[Recommendation]:
    compute_ms = max(ctx.step_ms - data_ms, 1e-3)
    # Enough workers to hide loading behind compute, no more than there are cores (or 8).
    workers = int(min(max(1, ctx.cpu_cores), max(1, math.ceil(data_ms / compute_ms)), 8))
    new_step = max(compute_ms, data_ms / workers)
    caveat = ", less where they share the CPU with the compute (a CPU trial)" if ctx.device_type == "cpu" else ""
    recs = [
        Recommendation(
            f"Load batches in {workers} worker process(es)",
            {"num_workers": workers, "persistent_workers": True},
            f"step ≈ max(compute {compute_ms:.0f} ms, data {data_ms:.0f} ms ÷ {workers}) ≈ {new_step:.0f} ms "
            f"(≈{ctx.step_ms / new_step:.1f}× faster){caveat}",
            "with num_workers=0 the training loop waits while each batch is decoded; workers prepare the "
            "next batches while the model computes",
        ),
        Recommendation(
            "Pin host memory for the batches",
            {"pin_memory": True, "num_workers": max(ctx.config.num_workers, workers)},
            "host→GPU copies become asynchronous and about twice as fast",
            "pageable memory is staged through a pinned buffer by the driver, synchronously",
        ),
        Recommendation(
            "Prefetch more batches per worker",
            {"num_workers": max(ctx.config.num_workers, workers), "prefetch_factor": 4},
            "absorbs slow batches (variable decode cost); no gain when loading is uniformly slow",
            "each worker keeps 4 batches ready instead of 2",
        ),
    ]
    return ctx.offer(recs)


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


def for_overhead(ctx: Context, optimizer_share: float) -> list[Recommendation]:
    bigger = ctx.batch_size * 4 if ctx.batch_size else None
    batch = Recommendation(
        f"Raise the batch size to {bigger}",
        {"batch_size": bigger} if bigger else {},
        "per-sample time falls while fixed per-op costs dominate (up to ≈4× the throughput); "
        "check the memory first with `workbench estimate`",
        "the cost of launching an op barely depends on its size, so bigger ops amortize it",
    )
    foreach = Recommendation(
        "Batch the optimizer's per-parameter ops",
        {"optimizer_impl": "foreach"},
        f"the optimizer takes {optimizer_share:.0%} of the step; foreach runs it as a few multi-tensor "
        "ops instead of ~10 ops per parameter",
        "a for-loop optimizer launches one small op per parameter and per update term",
    )
    graphs = _cuda_graphs_or_its_blocker(ctx.sync_sites)
    reduce = Recommendation(
        "Compile with mode=reduce-overhead",
        {"compile": "reduce-overhead"},
        "fuses ops and replays them as CUDA graphs",
        "fewer, larger kernels and no per-kernel launch",
    )
    fuse = Recommendation(
        "Compile the model",
        {"compile": "default"},
        "fuses chains of small ops into a few kernels (first step pays the compile, minutes on CPU)",
        "fewer ops means fewer dispatches through Python and the dispatcher",
    )
    if ctx.device_type == "cuda":
        order = [graphs, reduce, foreach, batch, fuse]
    else:
        order = [foreach, batch, fuse] if optimizer_share >= 0.2 else [batch, fuse, foreach]
    if optimizer_share < 0.1 or (ctx.optimizer_impl or ctx.config.optimizer_impl) != "for-loop":
        order = [r for r in order if r is not foreach]
    if bigger is None:
        order = [r for r in order if r is not batch]
    return ctx.offer(order)


def _cuda_graphs_or_its_blocker(sync_sites: list[dict[str, Any]]) -> Recommendation:
    """CUDA graphs when the step is capturable; else the sync that makes capture fail, to remove first.

    A host sync inside `torch.cuda.graph(...)` fails the capture ("operation not permitted when
    stream is capturing"), so cuda_graphs=true would only turn the trial into an error.
    """
    if not sync_sites:
        return Recommendation(
            "Capture the step in a CUDA graph",
            {"cuda_graphs": True},
            "launch cost drops to one graph launch per step; the GPU no longer waits between kernels",
            "the CPU cannot launch small kernels as fast as the GPU runs them",
        )
    first = max(sync_sites, key=lambda site: site.get("count", 0))
    what = first.get("code") or first.get("op", "a host read")
    via = f" (via {first['via']})" if first.get("via") else ""
    if "grad_scaler" in str(first.get("via", "")):
        via += ", fp16's GradScaler inf check: amp=bf16 needs none"
    others = f", and {len(sync_sites) - 1} other sync site(s)" if len(sync_sites) > 1 else ""
    return Recommendation(
        f"Remove the host sync at {first.get('source', '?')} first, then capture the step in a CUDA graph",
        {},
        "once the step never waits for the device it can be captured: one graph launch per step",
        f"`{what}`{via} makes the host wait for the device ({first.get('op', 'sync')}){others}; "
        "a sync cannot be captured, so cuda_graphs=true would fail at capture until it is gone",
    )


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


def for_compute(ctx: Context, conv_share: float, mfu: float | None) -> list[Recommendation]:
    recs = [
        Recommendation(
            "Run matmuls and convolutions in bf16",
            {"amp": "bf16"},
            "tensor cores (or the CPU's bf16 units) run bf16 at several times the fp32 rate",
            "the step is spent in matmul/conv arithmetic, which bf16 speeds up directly",
        ),
        Recommendation(
            "Allow TF32 for fp32 matmuls",
            {"matmul_precision": "high"},
            "fp32 matmuls run on tensor cores at ≈8× the fp32 rate (Ampere and newer)",
            "TF32 keeps fp32's range with a 10-bit mantissa; training is unaffected in practice",
        ),
        Recommendation(
            "Use channels_last memory format",
            {"channels_last": True} if conv_share >= 0.2 else {},
            f"convolutions take {conv_share:.0%} of kernel time; NHWC kernels are the fast path",
            "cuDNN/oneDNN convolution kernels are written for NHWC",
        ),
        Recommendation(
            "Compile the model",
            {"compile": "default"},
            "fuses the element-wise work around the matmuls; the matmuls themselves stay",
            "less memory traffic between the compute-heavy ops",
        ),
    ]
    if mfu is not None and mfu >= 0.5:
        recs = [r for r in recs if r.changes.get("amp") or r.changes.get("matmul_precision")]
    return ctx.offer([r for r in recs if r.changes])


def for_bandwidth(ctx: Context, conv_share: float) -> list[Recommendation]:
    recs = [
        Recommendation(
            "Compile the model to fuse element-wise ops",
            {"compile": "default"},
            "chains of element-wise/normalization ops become one kernel that reads and writes each tensor once",
            "these ops are limited by memory traffic, not arithmetic",
        ),
        Recommendation(
            "Train in bf16",
            {"amp": "bf16"},
            "halves the bytes every activation read and write moves",
            "memory-bound ops run at bytes/bandwidth: fewer bytes, less time",
        ),
        Recommendation(
            "Use channels_last memory format",
            {"channels_last": True} if conv_share >= 0.2 else {},
            "avoids layout conversions around convolutions",
            "NCHW convolutions may transpose to NHWC and back, twice the traffic",
        ),
    ]
    return ctx.offer([r for r in recs if r.changes])


def for_memory(ctx: Context) -> list[Recommendation]:
    recs = [
        Recommendation(
            "Checkpoint activations selectively",
            {"activation_checkpointing": "selective"},
            "activations shrink by the element-wise ops' share at ≈5-10% more compute",
            "matmul/conv outputs are kept, cheap ops are recomputed in backward",
        ),
        Recommendation(
            "Checkpoint activations fully",
            {"activation_checkpointing": "full"},
            "activations shrink to the blocks' inputs at ≈30% more compute",
            "each block's forward runs again in backward instead of being stored",
        ),
        Recommendation(
            "Train in bf16",
            {"amp": "bf16"},
            "activations stored in bf16 take half the memory",
            "autocast keeps matmul/conv outputs in bf16",
        ),
    ]
    return ctx.offer(recs)
