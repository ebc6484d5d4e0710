"""How busy the trial kept its device, and the energy it drew, over the timed window only.

`WindowProbe` starts right before the first timed step and stops after the window's closing
synchronization, so warm-up and compile never enter it. The means come from two readings,
one at each end (CPU time of the trial's process tree and of the whole host; on CUDA the
GPU's total-energy counter), so they do not depend on a thread's timing; a daemon thread
samples at 10 Hz in between only for the spread (median, p10–p90) and for the GPU's clock and
memory, which have no cumulative counter. The trade-off: about a tenth of a millisecond of CPU
per sample against a spread that one pair of readings lacks. NVML's utilization is read once,
at the end, from its own sample buffer (`nvmlDeviceGetSamples`): each of its samples covers the
sample period (1/6 s to 1 s) before its timestamp, so only samples whose whole period lies
inside the window are kept, and a window shorter than a few periods gets no figure, with the
reason, rather than one that counts the idle time before the window.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import numpy as np

from workbench.measure.hostload import _machine_busy_s

#: Sampling rate of the thread that gives the spread (the means need no thread); 0 starts no
#: thread (the overhead benchmark's control arm).
RATE_HZ = 10.0
#: The descendant processes (DataLoader workers) are re-listed every this many samples.
RELIST_EVERY = 10
#: NVML utilization samples whose whole period lies inside the window, below which the window
#: is too short for NVML's sampling and no utilization figure is given.
MIN_NVML_SAMPLES = 3
#: How far before the window NVML's buffer is asked from: the sample before the window's start
#: tells where the first sample inside it began.
NVML_LOOKBACK_S = 2.0


def spread(values: list[float]) -> dict[str, float] | None:
    """{'median', 'p10', 'p90'} of per-sample values; None without any."""
    if not values:
        return None
    p10, median, p90 = np.percentile(np.asarray(values, dtype=float), [10, 50, 90])
    return {"median": float(median), "p10": float(p10), "p90": float(p90)}


def cores_available() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class WindowProbe:
    """`start()` before the first timed step, `stop()` after the window's last synchronization;
    then `utilization` and `energy` hold the window's figures and `window` its (start, end) in
    `time.time()` seconds, the clock the device monitor's samples carry."""

    def __init__(self, device: Any, rate_hz: float | None = None) -> None:
        import psutil

        self._psutil = psutil
        rate = RATE_HZ if rate_hz is None else rate_hz
        self._period = 1.0 / rate if rate > 0 else None
        self._tree = _TreeCpu(psutil)
        self._gpu = _GpuReader.open(device) if getattr(device, "type", "cpu") == "cuda" else None
        self._readings: list[tuple[float, float, float]] = []
        self._gpu_samples: list[dict[str, float | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._energy_mj: float | None = None
        self.window: tuple[float, float] | None = None
        self.utilization: dict[str, Any] | None = None
        self.energy: dict[str, Any] | None = None

    def start(self) -> WindowProbe:
        self._begin_wall = time.time()
        self._begin = time.monotonic()
        self._readings = [self._reading()]
        if self._gpu is not None:
            self._energy_mj = self._gpu.energy_mj()
        if self._period is not None:
            self._thread = threading.Thread(target=self._run, name="workbench-window-probe", daemon=True)
            self._thread.start()
        return self

    def stop(self, steps: int, samples_per_step: int) -> None:
        """End the window: `steps` timed steps of `samples_per_step` samples ran in it."""
        energy_mj = self._gpu.energy_mj() if self._gpu is not None else None
        self._stop.set()  # joined before the last reading: the two threads never read at once
        if self._thread is not None:
            self._thread.join(1.0)
        end = self._reading()
        # Read, not derived from the monotonic span: a pause between start's two reads would shift it.
        end_wall = time.time()
        self._readings.append(end)
        if self._gpu is not None:
            self._gpu_samples.append(self._gpu.read())
        self.window = (self._begin_wall, end_wall)
        cpu = cpu_figures(self._readings, cores_available(), self._psutil.cpu_count() or 1)
        cpu["torch_threads"] = _torch_threads()
        self.utilization = {"cpu": cpu}
        if self._gpu is not None:
            self.utilization["gpu"] = self._gpu.summary(self._gpu_samples, self.window)
        else:
            self.utilization["gpu"] = None
        self.utilization["gpu_reason"] = "" if self._gpu is not None and self._gpu.handle else _gpu_reason(self._gpu)
        self.energy = energy_figures(
            self._energy_mj, energy_mj, steps, samples_per_step, end[0] - self._begin, _energy_reason(self._gpu)
        )
        if self._gpu is not None:
            self._gpu.close()

    def abandon(self) -> None:
        """Stop the thread without figures (the window ended in an exception)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        if self._gpu is not None:
            self._gpu.close()

    # --- internals -----------------------------------------------------------------

    def _reading(self) -> tuple[float, float, float]:
        """(monotonic s, trial process-tree CPU s, whole-host busy CPU s)."""
        return time.monotonic(), self._tree.seconds(), _machine_busy_s()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self._period or 0.1):
            tick += 1
            if tick % RELIST_EVERY == 0:
                self._tree.relist()
            self._readings.append(self._reading())
            if self._gpu is not None:
                self._gpu_samples.append(self._gpu.read())


def cpu_figures(readings: list[tuple[float, float, float]], cores: int, host_cores: int) -> dict[str, Any]:
    """The window's CPU figures from (monotonic s, trial CPU s, host busy CPU s) readings in time
    order: means from the first and last, the spread from consecutive pairs."""
    (t0, trial0, host0), (t1, trial1, host1) = readings[0], readings[-1]
    wall = max(t1 - t0, 1e-9)
    used = max(0.0, trial1 - trial0) / wall
    host = max(0.0, host1 - host0) / wall
    per_trial, per_host = [], []
    for (a, ca, ha), (b, cb, hb) in itertools.pairwise(readings):
        if b - a > 1e-3:
            per_trial.append(max(0.0, cb - ca) / (b - a))
            per_host.append(100.0 * max(0.0, hb - ha) / (b - a) / host_cores)
    return {
        "window_s": wall,
        "cores_used": used,
        "cores_available": cores,
        "util_pct": 100.0 * used / cores,
        "host_busy_cores": host,
        "host_cores": host_cores,
        "host_pct": 100.0 * host / host_cores,
        "other_cores": max(0.0, host - used),
        "cores_used_spread": spread(per_trial),
        "host_pct_spread": spread(per_host),
        "samples": len(per_trial),
        "method": "CPU time of the trial process and its live child processes ÷ wall time of the timed window; "
        "host = busy time of all cores (psutil.cpu_times)",
    }


def samples_inside(samples: list[tuple[int, float]], start_s: float, end_s: float) -> list[float]:
    """Values of the NVML samples `(timestamp µs, value)` whose whole period lies in [start, end].

    A sample's value covers the time since the sample before it, so the first sample after the
    window's start still counts time from before it: it is dropped, as is any sample without a
    predecessor in the buffer (where its period began is unknown).
    """
    ordered = sorted(samples)
    start_us, end_us = start_s * 1e6, end_s * 1e6
    return [
        value for (before, _), (stamp, value) in itertools.pairwise(ordered) if before >= start_us and stamp <= end_us
    ]


def window_utilization(samples: list[tuple[int, float]], window: tuple[float, float]) -> dict[str, Any]:
    """{'spread', 'samples_inside', 'sample_period_s', 'reason'} of one NVML utilization series."""
    stamps = sorted(stamp for stamp, _ in samples)
    period = float(np.median(np.diff(stamps))) / 1e6 if len(stamps) > 1 else None
    inside = samples_inside(samples, *window)
    figures: dict[str, Any] = {"spread": None, "samples_inside": len(inside), "sample_period_s": period, "reason": ""}
    if len(inside) >= MIN_NVML_SAMPLES:
        figures["spread"] = spread(inside)
    else:
        every = f"one every {period:.2f} s" if period else "none in its buffer"
        figures["reason"] = (
            f"window too short for NVML's sampling: {len(inside)} utilization sample(s) ({every}) fell wholly inside "
            f"the {window[1] - window[0]:.2f} s window, {MIN_NVML_SAMPLES} needed: time more steps"
        )
    return figures


def energy_figures(
    start_mj: float | None, end_mj: float | None, steps: int, samples_per_step: int, window_s: float, reason: str
) -> dict[str, Any]:
    """Joules per step and per sample from the GPU's total-energy counter (millijoules since the
    driver loaded) read at both ends of the window; otherwise the reason there is none."""
    if start_mj is None or end_mj is None:
        return {"available": False, "reason": reason}
    if end_mj < start_mj:
        return {"available": False, "reason": "the energy counter went backwards (the driver reloaded?)"}
    if end_mj == start_mj or steps <= 0:
        return {"available": False, "reason": f"the energy counter did not advance over the {window_s:.2f} s "
                "window: time more steps"}  # fmt: skip
    joules = (end_mj - start_mj) / 1000.0
    return {
        "available": True,
        "joules": joules,
        "per_step_j": joules / steps,
        "per_sample_j": joules / (steps * samples_per_step) if samples_per_step else None,
        "mean_power_w": joules / window_s if window_s > 0 else None,
        "method": "NVML total energy counter (nvmlDeviceGetTotalEnergyConsumption) at both ends of the timed window",
    }


class _TreeCpu:
    """CPU seconds of this process (all its threads) plus its live descendants (DataLoader
    workers); a descendant that ended keeps the last value read of it."""

    def __init__(self, psutil: Any) -> None:
        self._psutil = psutil
        self._me = psutil.Process()
        self._children: dict[int, Any] = {}
        self._last: dict[int, float] = {}
        self.relist()

    def relist(self) -> None:
        try:
            for child in self._me.children(recursive=True):
                self._children.setdefault(child.pid, child)
        except self._psutil.Error:
            pass

    def seconds(self) -> float:
        total = time.process_time()
        for pid, child in self._children.items():
            try:
                times = child.cpu_times()
                self._last[pid] = float(times.user + times.system)
            except self._psutil.Error:
                pass  # ended: its last reading stands
            total += self._last.get(pid, 0.0)
        return total


class _GpuReader:
    """NVML reads of the trial's own GPU (found by UUID: CUDA's index is not NVML's under
    CUDA_VISIBLE_DEVICES)."""

    def __init__(self, nvml: Any, handle: Any, index: int | None, name: str, reason: str) -> None:
        self._nvml = nvml
        self.handle = handle
        self.index = index
        self.name = name
        self.reason = reason

    @classmethod
    def open(cls, device: Any) -> _GpuReader:
        try:
            import pynvml
        except ImportError:
            return cls(None, None, None, "", "pynvml is not importable; install nvidia-ml-py")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return cls(None, None, None, "", f"NVML cannot start ({exc})")
        try:
            handle = _handle_for(pynvml, device)
            index = int(pynvml.nvmlDeviceGetIndex(handle))
            name = pynvml.nvmlDeviceGetName(handle)
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            return cls(None, None, None, "", f"NVML cannot find {device} ({exc})")
        return cls(pynvml, handle, index, name.decode() if isinstance(name, bytes) else str(name), "")

    def close(self) -> None:
        if self._nvml is not None and self.handle is not None:
            self.handle = None
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass

    def energy_mj(self) -> float | None:
        if self.handle is None:
            return None
        value = self._call(self._nvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)
        if value is None:
            self.reason = "this GPU does not report its total energy (NVML needs Volta or newer)"
        return None if value is None else float(value)

    def read(self) -> dict[str, float | None]:
        nv, handle = self._nvml, self.handle
        if handle is None:
            return {}
        memory = self._call(nv.nvmlDeviceGetMemoryInfo, handle)
        clock = self._call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
        return {
            "sm_clock_mhz": None if clock is None else float(clock),
            "mem_used_bytes": None if memory is None else float(memory.used),
        }

    def utilization_samples(self, kind: int, since_s: float) -> list[tuple[int, float]] | None:
        """NVML's buffered samples of `kind` newer than `since_s` as (timestamp µs, value); None if unsupported."""
        try:
            value_type, samples = self._nvml.nvmlDeviceGetSamples(self.handle, kind, int(since_s * 1e6))
        except self._nvml.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(self._nvml, "NVML_ERROR_NOT_FOUND", object()):
                return []  # no sample newer than `since_s`
            return None
        field = _NVML_VALUE_FIELDS.get(int(value_type), "uiVal")
        return [(int(s.timeStamp), float(getattr(s.sampleValue, field))) for s in samples]

    def summary(self, samples: list[dict[str, float | None]], window: tuple[float, float]) -> dict[str, Any] | None:
        if self.index is None:
            return None
        figures: dict[str, Any] = {"nvml_index": self.index, "name": self.name, "samples": len(samples)}
        nv, reasons = self._nvml, []
        for key, kind in (
            ("util_pct", nv.NVML_GPU_UTILIZATION_SAMPLES),
            ("mem_util_pct", nv.NVML_MEMORY_UTILIZATION_SAMPLES),
        ):
            series = self.utilization_samples(kind, window[0] - NVML_LOOKBACK_S)
            if series is None:
                figures[key] = None
                reasons.append(f"{key}: this GPU does not give NVML utilization samples")
                continue
            util = window_utilization(series, window)
            figures[key] = util["spread"]
            figures[f"{key}_samples"] = util["samples_inside"]
            figures["nvml_sample_period_s"] = util["sample_period_s"]
            if util["reason"]:
                reasons.append(util["reason"])
        figures["util_reason"] = "; ".join(dict.fromkeys(reasons))
        for key in ("sm_clock_mhz", "mem_used_bytes"):
            figures[key] = spread([v for s in samples if (v := s.get(key)) is not None])
        figures["method"] = (
            "NVML utilization (share of time a kernel ran / memory was read or written) from NVML's own samples "
            "whose whole sample period lies inside the timed window; SM clock and memory used sampled at 10 Hz "
            "inside the window on this trial's GPU"
        )
        return figures

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:  # NOT_SUPPORTED on this GPU
            return None


#: nvmlValueType_t -> the field of nvmlValue_t that holds it.
_NVML_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _handle_for(nvml: Any, device: Any) -> Any:
    """The NVML handle of a torch CUDA device, by its UUID (falls back to the same index)."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
        except nvml.NVMLError:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _gpu_reason(gpu: _GpuReader | None) -> str:
    return "a CPU trial: no GPU figures" if gpu is None else gpu.reason


def _energy_reason(gpu: _GpuReader | None) -> str:
    if gpu is None:
        return "a CPU trial: energy needs a GPU's energy counter (NVML, Volta or newer); the CPU's is not read"
    return gpu.reason or "the GPU's energy counter could not be read"


def _torch_threads() -> int | None:
    import sys

    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None
