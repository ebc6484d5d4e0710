"""The profiled window: torch.profiler over a few steps *after* the timed window, never inside it.

The profiler costs 10-90% of step time on CPU (+9-12% plain, +81-87% with shapes, stacks and
memory, measured on a 2-core host), so its figures are shares and
counts — where the time goes — never the trial's step time. Each step carries
`record_function` ranges for data/forward/backward/optimizer, the trace is written as gzip
Chrome/Perfetto JSON (size-capped, HolisticTraceAnalysis reads it), and the events are
reduced here to plain data: a top-operators table, the host/launch-overhead figures, the
kernel mix (matmul/conv vs memory-bound ops) and the host-synchronizing calls with the
Python lines that made them. Judging those figures is `analysis/diagnose.py`'s job.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.measure.compiled_kernels import compiled_kernels, launches, median_launch_us
from workbench.measure.memory_timeline import MemoryTimelineUnavailable, record_memory_timeline
from workbench.measure.op_table import kernel_table, kineto_dtypes, op_table
from workbench.measure.ranges import COMPUTE_PHASES as COMPUTE_PHASES
from workbench.measure.ranges import RANGE_PREFIX as RANGE_PREFIX  # re-exported: nvtx and tests read it here
from workbench.measure.step_timeline import step_timeline
from workbench.measure.timing import synchronize

if TYPE_CHECKING:
    from workbench.config import TrainConfig
    from workbench.levers.build import TrainStep

#: Kernels/ops whose time is arithmetic (tensor cores, GEMM/conv units): the rest is memory-bound.
_COMPUTE_HEAVY = re.compile(r"mm|conv|gemm|cutlass|xmma|wgmma|flash|fmha|attention|cudnn|_scaled_dot_product", re.I)
_CONV = re.compile(r"conv", re.I)
_KERNEL_OPS = ("aten::", "mkldnn::", "torchvision::")
#: Annotations that are not operators: our phase ranges, the schedule's steps, the loader's fetch.
_NOT_OPERATORS = (RANGE_PREFIX, "ProfilerStep", "enumerate(DataLoader)", "Optimizer.zero_grad")


@dataclass(frozen=True)
class ProfileOptions:
    """How to profile: `wait` + `warmup` + `active` steps (torch.profiler.schedule), once."""

    wait: int = 1
    """Steps run before the profiler starts recording (lets the previous window's work drain)."""
    warmup: int = 1
    """Steps recorded and thrown away: the profiler's own start-up cost lands here."""
    active: int = 2
    """Steps whose events are kept; figures are per active step."""
    trace_dir: str | None = None
    """Where the gzip trace goes; None: <tmp>/workbench-traces."""
    max_trace_bytes: int = 20 * 2**20
    """Cap on the gzip trace; a larger one is cut to the first active step, then dropped."""
    record_shapes: bool = True
    """Input shapes in the top-operators table (adds a little profiler overhead)."""
    top_k: int = 15
    scan_syncs: bool = True
    """One more step under a dispatch mode that records each host-synchronizing call's source line."""
    memory_timeline: bool = True
    """One more step under the memory profiler: memory over the step by category (`measure.memory_timeline`)."""
    timeline_steps: int = 20
    """Most steps the step timeline (the Gantt summary of the recorded steps) keeps."""

    def __post_init__(self) -> None:
        from workbench.config import ConfigError

        for name in ("wait", "warmup", "active", "top_k"):
            value = getattr(self, name)
            low = 1 if name in ("active", "top_k") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"profile option {name} must be an integer >= {low}, got {value!r}")

    @classmethod
    def coerce(cls, value: bool | ProfileOptions | dict[str, Any] | None) -> ProfileOptions | None:
        """`run_trial(profile=...)` accepts True, options, or their dict (as sent to a worker)."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, dict):
            return cls(**value)
        if isinstance(value, cls):
            return value
        from workbench.config import ConfigError

        raise ConfigError(f"profile must be True/False or ProfileOptions, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProfileSummary:
    """What one profiled window showed, as plain data (stored in `TrialResult.profile`)."""

    device_type: str
    active_steps: int
    step_ms: list[float] = field(default_factory=list)
    """Wall time of each active step *under the profiler* (inflated: use only for shares)."""
    phase_share: dict[str, float] = field(default_factory=dict)
    """Host time of each phase's range ÷ the sum over phases."""
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    ops_per_step: float = 0.0
    overhead: dict[str, Any] = field(default_factory=dict)
    """CPU: framework_overhead_share, op_floor_us; CUDA: device_idle_share, kernels_per_step,
    median_kernel_us, short_kernel_share."""
    kernel_mix: dict[str, float] = field(default_factory=dict)
    """Shares of kernel time: compute_heavy (matmul/conv/attention), conv, memory_bound."""
    syncs: dict[str, Any] = field(default_factory=dict)
    """per_step, sites: [{op, source, code, via, count}], or 'error'."""
    trace_path: str | None = None
    trace_bytes: int = 0
    trace_note: str = ""
    op_table: list[dict[str, Any]] = field(default_factory=list)
    """Every operator by name, per active step: ms_per_step (self), calls_per_step, dtypes (`measure.op_table`)."""
    kernel_table: list[dict[str, Any]] = field(default_factory=list)
    """CUDA only: every kernel by name, per active step (device time, launches)."""
    memory_timeline: dict[str, Any] = field(default_factory=dict)
    """One step's memory over time by category, its phases and peak (`measure.memory_timeline`), or 'error'."""
    step_timeline: dict[str, Any] = field(default_factory=dict)
    """Gantt summary of the recorded steps: phases per step and top ops (`measure.step_timeline`)."""
    launches_per_step: float | None = None
    """Launches per step in the compute phases: device kernels on CUDA, leaf operator calls on CPU
    (`measure.compiled_kernels.launches`; None in results recorded before it was)."""
    median_launch_us: float | None = None
    """Median time of one launch's work: a kernel's device time on CUDA, a leaf op's self time on CPU."""
    compiled: dict[str, Any] = field(default_factory=dict)
    """A compiled step's kernels ({} when none ran): eager_launches_per_step (the same step run eagerly), fused
    (generated kernels ranked by time, each with the ATen ops it fused), extern, fused_share, note
    (`measure.compiled_kernels`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfileSummary:
        return cls(**data)


# --- the window ---------------------------------------------------------------------------


def profile_window(
    train_step: TrainStep, batches: Iterator[Any], config: TrainConfig, options: ProfileOptions, trial_id: str
) -> ProfileSummary:
    """Run wait+warmup+active profiled steps, write the trace, reduce the events to a summary."""
    from torch.profiler import ProfilerActivity, profile, schedule

    dev = train_step.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    captured: dict[str, Any] = {}

    def on_ready(prof: Any) -> None:
        # Everything is read inside the handler: the events are freed once it returns.
        captured["summary"] = summarize_profile(prof, dev.type, options, trial_id)

    total = options.wait + options.warmup + options.active
    sched = schedule(wait=options.wait, warmup=options.warmup, active=options.active, repeat=1)
    with profile(
        activities=activities, schedule=sched, record_shapes=options.record_shapes, on_trace_ready=on_ready
    ) as prof:
        for _ in range(total):
            _profiled_step(train_step, batches, config)
            synchronize(dev)
            prof.step()
    summary: ProfileSummary = captured["summary"]
    if summary.compiled:
        summary.compiled.update(_eager_launches(train_step, batches, config))
    if options.memory_timeline:
        summary.memory_timeline = _memory_timeline(train_step, batches, config)
    if options.scan_syncs:
        from workbench.measure.syncscan import scan_syncs

        summary.syncs = scan_syncs(lambda: _profiled_step(train_step, batches, config, ranges=False), dev.type)
    return summary


def summarize_profile(prof: Any, device_type: str, options: ProfileOptions, trial_id: str) -> ProfileSummary:
    """A recorded torch.profiler window reduced to a `ProfileSummary`, its trace written: the same for a
    trial's window and for a watched job's window on demand (`workbench.watch`)."""
    floor_us = _op_floor_us(options.record_shapes) if device_type == "cpu" else 0.0
    summary = _summarize(prof, device_type, options, floor_us)
    summary.trace_path, summary.trace_bytes, summary.trace_note = _write_trace(prof, options, trial_id)
    return summary


def _memory_timeline(train_step: TrainStep, batches: Iterator[Any], config: TrainConfig) -> dict[str, Any]:
    """One more step under the memory profiler; a failure is reported in the summary, never raised.

    The loader runs before the profiler starts: the memory profiler records every Python and C call
    (it needs stacks), so a dataset doing per-sample Python work in this process (num_workers=0)
    would add millions of events and minutes to stopping it, for no memory figure."""
    try:
        loaded = iter([next(batches) for _ in range(config.grad_accumulation)])
        return record_memory_timeline(lambda: _profiled_step(train_step, loaded, config), train_step.device)
    except MemoryTimelineUnavailable as exc:
        return {"error": str(exc)}
    except Exception as exc:  # an optional view: its failure must not discard the profiled window
        return {"error": f"the memory profiler failed ({type(exc).__name__}: {exc})"}


def _eager_launches(train_step: TrainStep, batches: Iterator[Any], config: TrainConfig) -> dict[str, Any]:
    """The same step run eagerly once more, under the profiler: its launches per step, the
    number a compiled step's launches are read against ('eager_note' says why there is none)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    set_stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    if set_stance is None:
        return {"eager_launches_per_step": None, "eager_note": f"torch {torch.__version__} has no set_stance"}
    dev = train_step.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    try:
        with set_stance("force_eager"), profile(activities=activities) as prof:
            _profiled_step(train_step, batches, config)
            synchronize(dev)
    except Exception as exc:  # an optional figure: its failure must not discard the profiled window
        return {"eager_launches_per_step": None, "eager_note": f"the eager step failed ({type(exc).__name__}: {exc})"}
    events = list(prof.events())
    windows = _compute_windows(events)
    count = launches(events, dev.type, lambda e: _inside(e.time_range.start, windows))
    return {"eager_launches_per_step": float(count), "eager_note": ""}


def _profiled_step(train_step: TrainStep, batches: Iterator[Any], config: TrainConfig, ranges: bool = True) -> None:
    phases = _PhaseRanges(config.grad_accumulation, train_step.graphed is not None, enabled=ranges)
    phases.begin()
    micro = [train_step.prepare_batch(next(batches)) for _ in range(config.grad_accumulation)]
    phases.mark("data")
    train_step(micro, phases.mark)
    phases.end()


class _PhaseRanges:
    """`record_function` ranges driven by the step's `mark(phase)` calls.

    A mark says which phase just *ended*; a range must be named when it opens, so the next
    phase is predicted from the step's fixed order: data, (forward, backward) x accumulation,
    optimizer — or data, step under CUDA graphs.
    """

    def __init__(self, accumulation: int, graphed: bool, enabled: bool = True) -> None:
        self.accumulation, self.graphed, self.enabled = accumulation, graphed, enabled
        self._open: Any = None
        self._backwards = 0

    def _enter(self, phase: str | None) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
        if phase is not None and self.enabled:
            from torch.profiler import record_function

            self._open = record_function(RANGE_PREFIX + phase)
            self._open.__enter__()

    def begin(self) -> None:
        self._enter("data")

    def mark(self, ended: str) -> None:
        if ended == "data":
            self._enter("step" if self.graphed else "forward")
        elif ended == "forward":
            self._enter("backward")
        elif ended == "backward":
            self._backwards += 1
            self._enter("forward" if self._backwards < self.accumulation else "optimizer")
        else:
            self._enter(None)

    def end(self) -> None:
        self._enter(None)


# --- reducing the events --------------------------------------------------------------------


def _summarize(prof: Any, device_type: str, options: ProfileOptions, floor_us: float) -> ProfileSummary:
    events = list(prof.events())
    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    active = max(1, len(steps))
    summary = ProfileSummary(device_type=device_type, active_steps=active)
    summary.step_ms = [e.time_range.elapsed_us() / 1000.0 for e in steps]
    summary.phase_share = _phase_share(events)
    summary.top_ops = top_operators(prof, device_type, active, options.top_k)
    summary.op_table = op_table(events, device_type, active, _NOT_OPERATORS, kineto_dtypes(prof, events))
    summary.step_timeline = step_timeline(events, RANGE_PREFIX, max_steps=options.timeline_steps)
    if device_type == "cuda":
        summary.kernel_table = kernel_table(events, active)
    windows = _compute_windows(events)

    def inside(event: Any) -> bool:
        return _inside(event.time_range.start, windows)

    summary.launches_per_step = launches(events, device_type, inside) / active
    summary.median_launch_us = median_launch_us(events, device_type, inside)
    summary.compiled = compiled_kernels(events, device_type, active, inside)
    host_ops = [e for e in events if _is_host_op(e) and _inside(e.time_range.start, windows)]
    summary.ops_per_step = len(host_ops) / active
    if device_type == "cuda":
        kernels = [e for e in events if _is_device_kernel(e)]
        summary.overhead = _device_overhead(kernels, steps, active)
        summary.kernel_mix = _kernel_mix((e.name, e.time_range.elapsed_us()) for e in kernels)
    else:
        summary.overhead = _host_overhead(host_ops, windows, floor_us)
        summary.kernel_mix = _kernel_mix((e.name, max(0.0, e.self_cpu_time_total - floor_us)) for e in host_ops)
    return summary


def top_operators(prof: Any, device_type: str, active_steps: int, top_k: int) -> list[dict[str, Any]]:
    """Operators by self time per step (device time on CUDA), grouped by input shapes."""
    rows = []
    on_device = device_type == "cuda"
    for avg in prof.key_averages(group_by_input_shape=True):
        if avg.key.startswith(_NOT_OPERATORS):
            continue
        self_us = float(avg.self_device_time_total if on_device else avg.self_cpu_time_total)
        rows.append({
            "name": avg.key,
            "calls_per_step": avg.count / active_steps,
            "self_ms_per_step": self_us / 1000.0 / active_steps,
            "total_ms_per_step": float(avg.device_time_total if on_device else avg.cpu_time_total) / 1000.0 / active_steps,
            "host_self_ms_per_step": float(avg.self_cpu_time_total) / 1000.0 / active_steps,
            "input_shapes": _shapes_text(avg.input_shapes),
        })  # fmt: skip
    rows.sort(key=lambda row: row["self_ms_per_step"], reverse=True)
    total = sum(row["self_ms_per_step"] for row in rows) or 1.0
    for row in rows:
        row["self_share"] = row["self_ms_per_step"] / total
    return rows[:top_k]


def _phase_share(events: list[Any]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for event in events:
        if event.name.startswith(RANGE_PREFIX):
            phase = event.name[len(RANGE_PREFIX) :]
            totals[phase] = totals.get(phase, 0.0) + event.time_range.elapsed_us()
    whole = sum(totals.values()) or 1.0
    return {phase: value / whole for phase, value in totals.items()}


def _host_overhead(host_ops: list[Any], windows: list[tuple[float, float]], floor_us: float) -> dict[str, Any]:
    """CPU: the share of compute-phase wall time *not* spent doing an op's work.

    An op's work is its self time beyond the fixed cost of an empty op (`floor_us`, measured
    under the same profiler settings); the rest — dispatch, autograd bookkeeping, Python
    between ops, optimizer loops — is framework overhead, the CPU face of launch overhead.
    """
    wall = sum(end - start for start, end in windows)
    work = sum(max(0.0, e.self_cpu_time_total - floor_us) for e in host_ops)
    selfs = [e.self_cpu_time_total for e in host_ops]
    return {
        "framework_overhead_share": max(0.0, 1.0 - work / wall) if wall > 0 else None,
        "op_floor_us": floor_us,
        "median_op_self_us": statistics.median(selfs) if selfs else None,
        "compute_wall_ms": wall / 1000.0,
    }


def _device_overhead(kernels: list[Any], steps: list[Any], active: int) -> dict[str, Any]:
    """CUDA: how much of the active window the GPU sat idle between kernels, and how short they are."""
    intervals = _merge([(e.time_range.start, e.time_range.end) for e in kernels])
    if not intervals or not steps:
        return {"device_idle_share": None, "kernels_per_step": len(kernels) / active}
    start = min(min(s.time_range.start for s in steps), intervals[0][0])
    end = max(max(s.time_range.end for s in steps), intervals[-1][1])
    busy = sum(b - a for a, b in intervals)
    durations = [e.time_range.elapsed_us() for e in kernels]
    return {
        "device_idle_share": max(0.0, 1.0 - busy / (end - start)) if end > start else None,
        "kernels_per_step": len(kernels) / active,
        "median_kernel_us": statistics.median(durations),
        "short_kernel_share": sum(1 for d in durations if d < 10.0) / len(durations),
    }


def _kernel_mix(items: Any) -> dict[str, float]:
    total = heavy = conv = 0.0
    for name, time_us in items:
        total += time_us
        if _COMPUTE_HEAVY.search(name):
            heavy += time_us
            if _CONV.search(name):
                conv += time_us
    if total <= 0:
        return {}
    return {"compute_heavy": heavy / total, "conv": conv / total, "memory_bound": 1.0 - heavy / total}


def _op_floor_us(record_shapes: bool) -> float:
    """Median self time of an op that does no work (a 1-element add), under the same profiler settings."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
        for _ in range(200):
            torch.add(x, x)
    selfs = [e.self_cpu_time_total for e in prof.events() if e.name == "aten::add"]
    return float(statistics.median(selfs)) if selfs else 0.0


def _compute_windows(events: list[Any]) -> list[tuple[float, float]]:
    """The compute phases' (forward, backward, optimizer) time ranges, merged."""
    return _merge([(e.time_range.start, e.time_range.end) for e in events if _is_compute_range(e.name)])


def _is_compute_range(name: str) -> bool:
    return name.startswith(RANGE_PREFIX) and name[len(RANGE_PREFIX) :] in COMPUTE_PHASES


def _is_host_op(event: Any) -> bool:
    from torch.autograd import DeviceType

    return event.device_type == DeviceType.CPU and event.name.startswith(_KERNEL_OPS)


def _is_device_kernel(event: Any) -> bool:
    from torch.autograd import DeviceType

    return event.device_type == DeviceType.CUDA


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _inside(point: float, windows: list[tuple[float, float]]) -> bool:
    import bisect

    index = bisect.bisect_right(windows, (point, float("inf"))) - 1
    return index >= 0 and windows[index][0] <= point <= windows[index][1]


def _shapes_text(shapes: Any, limit: int = 80) -> str:
    text = ", ".join(str(list(s)) if isinstance(s, (list, tuple)) else str(s) for s in (shapes or []) if s != [])
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the trace file ----------------------------------------------------------------------------


def default_trace_dir() -> Path:
    return Path(tempfile.gettempdir()) / "workbench-traces"


def _write_trace(prof: Any, options: ProfileOptions, trial_id: str) -> tuple[str | None, int, str]:
    """Export the Chrome trace, gzip it; over the cap, keep the first active step only, else drop it."""
    directory = Path(options.trace_dir) if options.trace_dir else default_trace_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{trial_id}.pt.trace.json.gz"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        _gzip(raw, path)
        if path.stat().st_size <= options.max_trace_bytes:
            return str(path), path.stat().st_size, ""
        first_step_only(raw)
        _gzip(raw, path)
    size = path.stat().st_size
    if size <= options.max_trace_bytes:
        return str(path), size, f"trace cut to the first active step to stay under {options.max_trace_bytes} bytes"
    path.unlink()
    return None, 0, f"trace dropped: {size} bytes gzip even for one step (cap {options.max_trace_bytes})"


def _gzip(source: Path, target: Path) -> None:
    # No name or time in the gzip header: the same trace gives the same bytes.
    with open(source, "rb") as src, open(target, "wb") as out, gzip.GzipFile("", "wb", 6, out, mtime=0) as dst:
        shutil.copyfileobj(src, dst)


def first_step_only(raw: Path) -> None:
    """Rewrite a Chrome trace keeping metadata and the events that start inside the first ProfilerStep."""
    data = json.loads(raw.read_text())
    events = data.get("traceEvents", [])
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep")), key=lambda e: e["ts"])
    if steps:
        start, end = float(steps[0]["ts"]), float(steps[0]["ts"]) + float(steps[0].get("dur", 0))
        data["traceEvents"] = [e for e in events if "ts" not in e or start <= float(e["ts"]) < end]
    tmp = raw.with_suffix(".cut")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, raw)
