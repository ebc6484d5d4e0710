"""Device monitor: a sampler thread reading GPUs through NVML and the host through psutil.

It keeps a bounded ring buffer of plain-dict samples (JSON-ready, shared by the notebook
charts and the server's `metrics` endpoint) at a configurable rate, default 10 Hz. The
trade-off is cost against detail: reads that block (NVML's PCIe counters take ~20 ms
each) are taken once a second and carried forward, and the process tree is re-listed
once a second, so a 10 Hz sample costs well under a millisecond of the kernel's time.
Without NVML (no driver, no GPU, no `nvidia-ml-py`) it says why and serves host metrics.
Only psutil and pynvml are imported here, lazily: this module loads on GPU machines
that have nothing else.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time
from typing import Any, TypedDict

#: Default sampling rate; the UI charts redraw at 2-4 Hz from the same buffer.
DEFAULT_RATE_HZ = 10.0
#: Blocking or list-walking reads happen every `rate_hz * SLOW_READ_PERIOD_S` samples.
SLOW_READ_PERIOD_S = 1.0


class GpuSample(TypedDict):
    index: int
    name: str
    util_pct: float | None
    """Percent of the last sample period in which a kernel ran (NVML's coarse utilization)."""
    mem_util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    pcie_tx_bytes_s: float | None
    pcie_rx_bytes_s: float | None
    nvlink_tx_bytes_s: float | None
    nvlink_rx_bytes_s: float | None


class HostSample(TypedDict):
    cpu_pct: float
    """Mean busy percentage over all cores since the previous sample."""
    cpu_per_core_pct: list[float]
    ram_used_bytes: int
    ram_total_bytes: int
    rss_bytes: int | None
    """Resident memory of the watched process (this one by default)."""
    children_rss_bytes: int | None
    """Resident memory summed over the watched process's descendants (the trial workers)."""


class Sample(TypedDict):
    t: float
    """Wall-clock time (time.time()) of the reading."""
    gpus: list[GpuSample]
    host: HostSample


class DeviceMonitor:
    """Samples GPUs and host on a daemon thread into a ring buffer.

    `DeviceMonitor(rate_hz, history_s)` keeps `rate_hz * history_s` samples. Use as a
    context manager or call `start()`/`stop()`; read with `latest()`, `samples(since=t)`.
    """

    def __init__(
        self,
        rate_hz: float = DEFAULT_RATE_HZ,
        history_s: float = 120.0,
        *,
        pid: int | None = None,
        include_children: bool = True,
        use_nvml: bool = True,
    ) -> None:
        if not (isinstance(rate_hz, (int, float)) and math.isfinite(rate_hz) and 0 < rate_hz <= 1000):
            raise ValueError(f"rate_hz must be in (0, 1000], got {rate_hz!r}")
        if not (isinstance(history_s, (int, float)) and history_s > 0):
            raise ValueError(f"history_s must be a positive number of seconds, got {history_s!r}")
        self.rate_hz = float(rate_hz)
        self.capacity = max(1, math.ceil(rate_hz * history_s))
        self._buffer: collections.deque[Sample] = collections.deque(maxlen=self.capacity)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._host = _HostReader(pid if pid is not None else os.getpid(), include_children)
        self._gpus = _NvmlReader.open() if use_nvml else _NvmlReader.disabled("NVML disabled by the caller")
        self._slow_every = max(1, round(self.rate_hz * SLOW_READ_PERIOD_S))

    # --- life cycle ------------------------------------------------------------------

    def start(self) -> DeviceMonitor:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="workbench-device-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> DeviceMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def close(self) -> None:
        """Stop sampling and release NVML."""
        self.stop()
        self._gpus.shutdown()

    # --- reading -------------------------------------------------------------------

    def latest(self) -> Sample | None:
        with self._lock:
            return self._buffer[-1] if self._buffer else None

    def samples(self, since: float | None = None) -> list[Sample]:
        """Samples newer than `since` (time.time() seconds), oldest first; all when None."""
        with self._lock:
            items = list(self._buffer)
        if since is None:
            return items
        return [s for s in items if s["t"] > since]

    def gpu_status(self) -> tuple[bool, str]:
        """(NVML usable, reason it is not — or the GPUs it sees)."""
        return self._gpus.available, self._gpus.reason

    @property
    def gpu_count(self) -> int:
        return len(self._gpus.handles)

    @property
    def gpu_names(self) -> list[str]:
        return list(self._gpus.names)

    def sample_now(self) -> Sample:
        """Take one sample on the calling thread (and store it): tests, and a first point at once."""
        sample = self._read(slow=True)
        with self._lock:
            self._buffer.append(sample)
        return sample

    # --- internals -----------------------------------------------------------------

    def _read(self, slow: bool) -> Sample:
        return {"t": time.time(), "gpus": self._gpus.read(slow), "host": self._host.read(slow)}

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        begin = time.monotonic()
        tick = 0
        while True:
            # Absolute schedule: a slow read delays one sample, never the rate.
            sample = self._read(slow=tick % self._slow_every == 0)
            with self._lock:
                self._buffer.append(sample)
            tick += 1
            delay = begin + tick * period - time.monotonic()
            if delay < 0:  # fell behind (a long pause): skip the missed slots rather than burst
                tick += math.ceil(-delay / period)
                delay = begin + tick * period - time.monotonic()
            if self._stop.wait(max(0.0, delay)):
                return


class _HostReader:
    """CPU from /proc/stat deltas of our own (psutil.cpu_percent's reference point is
    process-global, so two monitors in one process would corrupt each other's readings)."""

    def __init__(self, pid: int, include_children: bool) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process(pid)
        self._include_children = include_children
        self._children: list[Any] = []
        self._last = psutil.cpu_times(percpu=True)

    def read(self, slow: bool) -> HostSample:
        psutil = self._psutil
        now = psutil.cpu_times(percpu=True)
        cores = [_busy_pct(a, b) for a, b in zip(self._last, now)]
        self._last = now
        memory = psutil.virtual_memory()
        return {
            "cpu_pct": sum(cores) / len(cores) if cores else 0.0,
            "cpu_per_core_pct": cores,
            "ram_used_bytes": int(memory.total - memory.available),
            "ram_total_bytes": int(memory.total),
            "rss_bytes": _rss(self._process),
            "children_rss_bytes": self._children_rss(slow) if self._include_children else None,
        }

    def _children_rss(self, relist: bool) -> int | None:
        if relist:
            try:
                self._children = self._process.children(recursive=True)
            except self._psutil.Error:
                return None
        sizes = [_rss(child) for child in self._children]
        return sum(s for s in sizes if s is not None)


def _rss(process: Any) -> int | None:
    try:
        return int(process.memory_info().rss)
    except Exception:  # psutil.NoSuchProcess / AccessDenied: a worker that just ended
        return None


def _busy_pct(before: Any, after: Any) -> float:
    """psutil's own definition: busy = all fields − idle − iowait (guest time is inside user)."""

    def totals(t: Any) -> tuple[float, float]:
        fields = t._asdict()
        total = sum(v for k, v in fields.items() if k not in ("guest", "guest_nice"))
        idle = fields.get("idle", 0.0) + fields.get("iowait", 0.0)
        return total, total - idle

    total0, busy0 = totals(before)
    total1, busy1 = totals(after)
    elapsed = total1 - total0
    if elapsed <= 0:
        return 0.0
    return max(0.0, min(100.0, 100.0 * (busy1 - busy0) / elapsed))


class _NvmlReader:
    """Per-GPU reads; each metric a GPU does not support stays None instead of failing the sample."""

    def __init__(self, nvml: Any, handles: list[Any], names: list[str], reason: str) -> None:
        self._nvml = nvml
        self.handles = handles
        self.names = names
        self.reason = reason
        self._slow: dict[int, tuple[float | None, float | None]] = {}
        self._nvlink_last: dict[int, tuple[float, float, float]] = {}

    @property
    def available(self) -> bool:
        return bool(self.handles)

    @classmethod
    def disabled(cls, reason: str) -> _NvmlReader:
        return cls(None, [], [], reason)

    @classmethod
    def open(cls) -> _NvmlReader:
        try:
            import pynvml
        except ImportError:
            return cls.disabled("pynvml is not importable; install nvidia-ml-py (pip install nvidia-ml-py)")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return cls.disabled(f"NVML cannot start ({exc}): no NVIDIA driver on this machine, or no access to it")
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            names = [_text(pynvml.nvmlDeviceGetName(h)) for h in handles]
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            return cls.disabled(f"NVML started but cannot list GPUs ({exc})")
        if not handles:
            pynvml.nvmlShutdown()
            return cls.disabled("NVML started but sees no GPU (check CUDA_VISIBLE_DEVICES and the driver)")
        return cls(pynvml, handles, names, f"NVML sees {count} GPU(s): {', '.join(names)}")

    def shutdown(self) -> None:
        if self._nvml is not None and self.handles:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self.handles = []

    def read(self, slow: bool) -> list[GpuSample]:
        return [self._read_one(i, h, slow) for i, h in enumerate(self.handles)]

    def _read_one(self, index: int, handle: Any, slow: bool) -> GpuSample:
        nv = self._nvml
        util = self._call(nv.nvmlDeviceGetUtilizationRates, handle)
        memory = self._call(nv.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self._call(nv.nvmlDeviceGetPowerUsage, handle)
        if slow:  # each PCIe read blocks ~20 ms inside NVML
            tx = self._call(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_TX_BYTES)
            rx = self._call(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_RX_BYTES)
            self._slow[index] = (None if tx is None else tx * 1024.0, None if rx is None else rx * 1024.0)
        pcie_tx, pcie_rx = self._slow.get(index, (None, None))
        nvlink_tx, nvlink_rx = self._nvlink(index, handle)
        return {
            "index": index,
            "name": self.names[index],
            "util_pct": None if util is None else float(util.gpu),
            "mem_util_pct": None if util is None else float(util.memory),
            "mem_used_bytes": None if memory is None else int(memory.used),
            "mem_total_bytes": None if memory is None else int(memory.total),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "temp_c": _float(self._call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)),
            "sm_clock_mhz": _float(self._call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)),
            "pcie_tx_bytes_s": pcie_tx,
            "pcie_rx_bytes_s": pcie_rx,
            "nvlink_tx_bytes_s": nvlink_tx,
            "nvlink_rx_bytes_s": nvlink_rx,
        }

    def _nvlink(self, index: int, handle: Any) -> tuple[float | None, float | None]:
        """NVLink data counters are cumulative KiB: the rate is the difference between two reads."""
        totals = self._nvlink_totals_kib(handle)
        if totals is None:
            return None, None
        now = time.monotonic()
        tx, rx = totals[0] * 1024.0, totals[1] * 1024.0
        last = self._nvlink_last.get(index)
        self._nvlink_last[index] = (now, tx, rx)
        if last is None or now <= last[0]:
            return None, None
        dt = now - last[0]
        return max(0.0, (tx - last[1]) / dt), max(0.0, (rx - last[2]) / dt)

    def _nvlink_totals_kib(self, handle: Any) -> tuple[float, float] | None:
        """(tx, rx) KiB over all links: the aggregate scope, or the per-link sum where it is refused."""
        nv = self._nvml
        values = self._call(nv.nvmlDeviceGetFieldValues, handle, nvlink_field_request(nv))
        if values is not None and all(v.nvmlReturn == nv.NVML_SUCCESS for v in values):
            return float(values[0].value.ullVal), float(values[1].value.ullVal)
        links = self._call(nv.nvmlDeviceGetFieldValues, handle, nvlink_field_request(nv, per_link=True))
        if links is None:
            return None
        sums = {nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 0.0, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 0.0}
        answered = False
        for value in links:  # links a part does not have answer NOT_SUPPORTED / INVALID_ARGUMENT
            if value.nvmlReturn == nv.NVML_SUCCESS:
                sums[value.fieldId] += float(value.value.ullVal)
                answered = True
        if not answered:
            return None
        return sums[nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX], sums[nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:  # NOT_SUPPORTED on this GPU, or a GPU that fell off the bus
            return None


#: NVML's scopeId for "all links summed" on the NVLink throughput fields (nvml.h: "A scopeId of
#: UINT_MAX returns aggregate value summed up across all links"); a bare field id means scope 0,
#: link 0 only, which on an 18-link H100/H200 is about 1/18 of the traffic.
NVML_SCOPE_ALL_LINKS = 0xFFFFFFFF


def nvlink_field_request(nv: Any, *, per_link: bool = False) -> list[tuple[int, int]]:
    """(fieldId, scopeId) pairs for `nvmlDeviceGetFieldValues`: TX then RX, over all links."""
    fields = [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
    if not per_link:
        return [(field, NVML_SCOPE_ALL_LINKS) for field in fields]
    return [(field, link) for field in fields for link in range(nv.NVML_NVLINK_MAX_LINKS)]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
