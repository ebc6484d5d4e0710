"""`TrialResult`: everything one measured trial produced, as plain data that round-trips through JSON.

Derived figures (median, spread, throughput) are computed from the stored per-step
times, never stored beside them, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Status = Literal["ok", "error", "oom", "timeout", "cancelled", "diverged"]
STATUSES: tuple[str, ...] = ("ok", "error", "oom", "timeout", "cancelled", "diverged")

#: keys `to_dict` adds for readers (JSON consumers); `from_dict` drops them.
DERIVED_KEYS = ("median_step_ms", "iqr_step_ms", "throughput")


@dataclass
class TrialResult:
    trial_id: str
    status: Status
    workload: str
    config: dict[str, Any]
    message: str = ""
    """Why a trial did not finish 'ok' (error text and traceback, OOM, the diverged step...)."""
    preset: str | None = None
    workload_source: dict[str, Any] | None = None
    device: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)
    applied: list[dict[str, Any]] = field(default_factory=list)
    """What was really applied: [{'toggle', 'value', 'detail'}]."""
    warmup: int = 0
    steps: int = 0
    batch_size: int = 0
    samples_per_step: int = 0
    warmup_step_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    """Timed-window step times; warm-up and compile never enter here."""
    phase_ms: dict[str, list[float]] = field(default_factory=dict)
    """Per timed step, time attributed to each phase (data, forward, backward, optimizer, step)."""
    losses: list[float] = field(default_factory=list)
    """Loss of every step in order: warm-up steps first, then the timed window."""
    peak_memory_bytes: int | None = None
    memory_method: str = ""
    """How the peak was measured (CUDA allocator / tensor tracker), or why it is missing."""
    memory_breakdown: dict[str, int] | None = None
    time_to_first_step_s: float | None = None
    compile_time_s: float = 0.0
    """First-step time beyond a steady step when compile or CUDA graphs is on; 0 otherwise."""
    compile_cache: str | None = None
    """What the compile found in Inductor's on-disk cache: 'cold', 'warm' or 'partly warm (...)';
    None when nothing was compiled through it. A warm compile is far faster than a cold one."""
    compile_report: dict[str, Any] | None = None
    data_stages: dict[str, Any] | None = None
    """Where the timed window's batches spent their time (`run_trial(data_stages=True)`): each stage's
    mean and p90, each loader worker's busy share, every fetch with its step (`measure.data_stages`);
    None when not asked for."""
    """A compiled trial's compile report (`measure.compile_report.CompileReport.to_dict()`): graphs,
    graph breaks with their reason and the user's file:line, recompiles with the failed guard, and
    compile time by stage; None when nothing was compiled (or for results stored before it existed)."""
    started_at: float = 0.0
    wall_time_s: float = 0.0
    diverged_step: int | None = None
    worker_pid: int | None = None
    """The process that ran the trial (a fresh worker per trial under process isolation)."""
    memory_modules: dict[str, dict[str, int]] | None = None
    """Per-module memory from the tracked step: {qualified name: {parameters, activations, peak}}."""
    profile: dict[str, Any] | None = None
    """The profiled window's summary (`measure.profile.ProfileSummary.to_dict()`) when asked for."""
    rank_step_ms: list[list[float]] = field(default_factory=list)
    """Distributed trials: every rank's timed-window step times, indexed by global rank (stragglers
    show here; `step_ms` holds rank 0's). Empty for single-process trials."""
    comparison: dict[str, Any] | None = None
    """Set on a comparison's stored trials when it ends: this configuration's calibrated figures
    (speedup, interval, verdict, units, design, noise), so the history keeps the verdict too."""
    distributed: dict[str, Any] | None = None
    """Distributed trials: strategy, backend, world size, per-rank compute/communication/overlap from
    the profiled window, all-reduce bandwidth and rank skew (`workbench.distributed.stats`)."""
    timed_window: list[float] | None = None
    """[start, end] of the timed window in `time.time()` seconds (the device monitor's clock)."""
    utilization: dict[str, Any] | None = None
    """The timed window's utilization (`measure.utilization`): 'cpu' (cores used of those the trial
    may use, host busy, other processes' cores, spread), 'gpu' (NVML utilization, memory-bandwidth
    utilization, SM clock, memory used: median, p10, p90; None on CPU) and 'gpu_reason'."""
    energy: dict[str, Any] | None = None
    """The timed window's energy: 'available', and 'joules', 'per_step_j', 'per_sample_j',
    'mean_power_w' from the GPU's energy counter — or the 'reason' there is none."""

    # --- derived figures -----------------------------------------------------------

    @property
    def median_step_ms(self) -> float | None:
        return float(np.median(self.step_ms)) if self.step_ms else None

    @property
    def iqr_step_ms(self) -> float | None:
        if not self.step_ms:
            return None
        q1, q3 = np.percentile(self.step_ms, [25, 75])
        return float(q3 - q1)

    @property
    def throughput(self) -> float | None:
        """Samples per second at the median step time."""
        median = self.median_step_ms
        if not median or not self.samples_per_step:
            return None
        return self.samples_per_step / (median / 1000.0)

    def phase_medians_ms(self) -> dict[str, float]:
        return {name: float(np.median(values)) for name, values in self.phase_ms.items() if values}

    @property
    def final_loss(self) -> float | None:
        finite = [x for x in self.losses if math.isfinite(x)]
        return finite[-1] if finite else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    # --- conversion ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update({key: getattr(self, key) for key in DERIVED_KEYS})
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known - set(DERIVED_KEYS)
        if unknown:
            raise ValueError(f"not a TrialResult: unknown keys {sorted(unknown)}")
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), allow_nan=True, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> TrialResult:
        return cls.from_dict(json.loads(text))
