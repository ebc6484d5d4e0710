"""A profiled window on demand in a watched loop: the next N steps under torch.profiler, the job never paused.

The training thread only starts and steps the profiler at its own step marks, and opens the
same phase ranges a workbench trial records (data, forward, backward, optimizer) from the
watch's hooks, so the window reads like a trial's. Once the window ends, the recorded profiler
is handed to the writer thread, which reduces it (`measure.profile.summarize_profile`, as for a
trial), diagnoses it with the watched steps' own phase times (`analysis.diagnose`) and stores
both. A window can be asked for by the job (`w.profile(steps=5)`) or from outside it
(`request_profile`: a row in the run history the writer polls).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.analysis.diagnose import Diagnosis, diagnose
from workbench.config import TrainConfig, field_names
from workbench.device import device_info
from workbench.measure.profile import RANGE_PREFIX, ProfileOptions, summarize_profile
from workbench.measure.result import TrialResult
from workbench.store.watched import StepRow


def window_options(steps: int) -> ProfileOptions:
    """One step to absorb the profiler's start-up, then the steps asked for; no memory timeline or
    sync scan (each needs extra steps run apart, which a user's loop cannot give)."""
    return ProfileOptions(wait=0, warmup=1, active=steps, record_shapes=False, scan_syncs=False, memory_timeline=False)


@dataclass
class ProfileJob:
    """A finished window, handed from the training thread to the writer."""

    prof: Any
    options: ProfileOptions
    first_step: int
    """The first recorded (active) step."""
    last_step: int
    request_id: int | None


@dataclass
class WatchProfile:
    """A watched window's result, as the job sees it (`Watch.last_profile`)."""

    diagnosis: Diagnosis | None
    profile: dict[str, Any] | None
    first_step: int
    last_step: int
    message: str = ""


class WindowProfiler:
    """Owned by a Watch: `request()` from any thread, the rest from the training thread only."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._lock = threading.Lock()
        self._pending: tuple[int, int | None] | None = None
        self._prof: Any = None
        self._options: ProfileOptions | None = None
        self._left = 0
        self._first = 0
        self._request: int | None = None
        self._range: Any = None

    @property
    def busy(self) -> bool:
        return self._pending is not None or self._prof is not None

    def request(self, steps: int, request_id: int | None = None) -> bool:
        """Profile the `steps` steps after the next one; False while a window is pending or running."""
        with self._lock:
            if self.busy:
                return False
            self._pending = (steps, request_id)
            return True

    def after_step(self, step: int) -> ProfileJob | None:
        """At the end of step `step`: step the running profiler (the finished window, when it ends),
        or start a requested one."""
        if self._prof is not None:
            self.close_range()
            self._prof.step()
            self._left -= 1
            if self._left > 0:
                return None
            prof, self._prof = self._prof, None
            prof.__exit__(None, None, None)
            assert self._options is not None
            return ProfileJob(prof, self._options, self._first, step, self._request)
        if self._pending is None:  # every step of a job that asked for nothing: no lock taken
            return None
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return None
        from torch.profiler import ProfilerActivity, profile, schedule

        steps, self._request = pending
        self._options = window_options(steps)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                             record_shapes=False)  # fmt: skip
        self._prof.__enter__()
        self._left, self._first = steps + 1, step + 2
        return None

    def open_range(self, phase: str) -> None:
        """Name what the loop does next (data, forward, backward, optimizer) while a window records."""
        if self._prof is None:
            return
        self.close_range()
        from torch.profiler import record_function

        self._range = record_function(RANGE_PREFIX + phase)
        self._range.__enter__()

    def close_range(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def abandon(self) -> ProfileJob | None:
        """The loop ended inside a window: stop the profiler; what was recorded is not a whole window."""
        self.close_range()
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
        return None


def reduce_window(job: ProfileJob, rows: Sequence[StepRow], config: dict[str, Any], name: str,
                  device: torch.device) -> WatchProfile:  # fmt: skip
    """The window as a trial's profile and diagnosis; `rows` are the watched steps it covered."""
    trial_id = f"watch-{name}-steps-{job.first_step}-{job.last_step}"
    summary = summarize_profile(job.prof, device.type, job.options, trial_id).to_dict()
    timed = [r for r in rows if job.first_step <= r.first_step <= job.last_step and r.step_ms is not None]
    if not timed:
        return WatchProfile(None, summary, job.first_step, job.last_step, "no timed step in the window")
    result = TrialResult(
        trial_id=trial_id, status="ok", workload=name, config=_train_config(config),
        device=device_info(device).to_dict(), step_ms=[float(r.step_ms or 0.0) for r in timed],
        phase_ms={phase: [float(getattr(r, f"{phase}_ms")) for r in timed if getattr(r, f"{phase}_ms") is not None]
                  for phase in ("data", "forward", "backward", "optimizer")},
        profile=summary, steps=len(timed),
    )  # fmt: skip
    return WatchProfile(diagnose(result), summary, job.first_step, job.last_step)


def _train_config(config: dict[str, Any]) -> dict[str, Any]:
    """The job's configuration as TrainConfig fields (the defaults for what it does not say)."""
    fields = {k: v for k, v in config.items() if k in field_names()}
    try:
        return TrainConfig.from_dict(fields).to_dict()
    except Exception:  # the job's own settings are not ours to validate: the defaults stand in
        return dataclasses.asdict(TrainConfig())
