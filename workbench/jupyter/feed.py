"""The `metrics` endpoint's data: `workbench.measure.monitor`, run by the server while someone watches.

One sampler per Jupyter server, started by the first request and stopped after
`idle_stop_s` without one — a server whose browser tabs are closed samples nothing.
Samples are turned into the API's JSON shape here (version 1, mirrored by
`extensions/src/metrics.ts`), so the front end does not change when the monitor does.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

API_VERSION = 1
DEFAULT_WINDOW_S = 120.0
MAX_WINDOW_S = 600.0


class Monitor(Protocol):
    """What the feed needs of `workbench.measure.monitor.DeviceMonitor` (tests pass a fake)."""

    def start(self) -> Any: ...
    def close(self) -> None: ...
    def samples(self, since: float | None = None) -> Any: ...
    def latest(self) -> Any: ...
    def gpu_status(self) -> tuple[bool, str]: ...


class MetricsFeed:
    """Owns the server's sampler: lazy start, idle stop, and history queries in API shape."""

    def __init__(
        self,
        *,
        rate_hz: float = 10.0,
        idle_stop_s: float = 120.0,
        monitor_factory: Callable[[float, float], Monitor] | None = None,
    ) -> None:
        self.rate_hz = rate_hz
        self.idle_stop_s = idle_stop_s
        self._factory = monitor_factory or _default_monitor
        self._lock = threading.Lock()
        self._monitor: Monitor | None = None
        self._last_request = 0.0
        self._stop_watch = threading.Event()

    @property
    def running(self) -> bool:
        return self._monitor is not None

    def snapshot(self, since: float | None = None, window_s: float = DEFAULT_WINDOW_S) -> dict[str, Any]:
        """Latest sample plus the history after `since` (at most `window_s` back from now)."""
        monitor = self._ensure_running()
        now = time.time()
        oldest = now - min(max(window_s, 0.0), MAX_WINDOW_S)
        after = oldest if since is None else max(since, oldest)
        history = [sample_to_api(s) for s in monitor.samples(since=after)]
        latest = monitor.latest()
        gpu_ok, gpu_reason = monitor.gpu_status()
        return {
            "api_version": API_VERSION,
            "now": now,
            "rate_hz": self.rate_hz,
            "window_s": now - oldest,
            "gpu_available": gpu_ok,
            "gpu_reason": gpu_reason,
            "latest": sample_to_api(latest, per_core=True) if latest is not None else None,
            "history": history,
        }

    def stop(self) -> None:
        """Stop sampling now; the next request starts it again. (At server exit the daemon threads just end.)"""
        with self._lock:
            monitor, self._monitor = self._monitor, None
            self._stop_watch.set()
        if monitor is not None:
            monitor.close()  # also releases NVML; a restart opens it again

    def _ensure_running(self) -> Monitor:
        with self._lock:
            self._last_request = time.monotonic()
            if self._monitor is None:
                self._monitor = self._factory(self.rate_hz, MAX_WINDOW_S)
                self._monitor.start()
                self._stop_watch = threading.Event()
                threading.Thread(
                    target=self._watch_idle, args=(self._stop_watch,), name="workbench-feed-idle", daemon=True
                ).start()
            return self._monitor

    def _watch_idle(self, stopped: threading.Event) -> None:
        # A thread, not a tornado PeriodicCallback: the feed must not depend on which event loop serves it.
        while not stopped.wait(min(5.0, self.idle_stop_s)):
            if time.monotonic() - self._last_request > self.idle_stop_s:
                self.stop()
                return


#: GPU fields the API passes on (GpuSample of workbench.measure.monitor), all numbers or null.
GPU_FIELDS = (
    "util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
    "nvlink_tx_bytes_s",
    "nvlink_rx_bytes_s",
)
HOST_FIELDS = ("cpu_pct", "ram_used_bytes", "ram_total_bytes", "rss_bytes")


def sample_to_api(sample: Mapping[str, Any], *, per_core: bool = False) -> dict[str, Any]:
    """One monitor sample → the API's sample dict; missing or non-finite numbers become null."""
    gpus = [
        {"index": int(g["index"]), "name": str(g.get("name", ""))} | {key: _num(g.get(key)) for key in GPU_FIELDS}
        for g in sample.get("gpus", [])
    ]
    host_in = sample.get("host", {})
    host: dict[str, Any] = {key: _num(host_in.get(key)) for key in HOST_FIELDS}
    if per_core:  # only in `latest`: 10 Hz × many cores would dominate the history's size
        host["cpu_per_core_pct"] = [_num(v) for v in host_in.get("cpu_per_core_pct", [])]
    return {"t": float(sample["t"]), "gpus": gpus, "host": host}


def _num(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _default_monitor(rate_hz: float, history_s: float) -> Monitor:
    from workbench.measure.monitor import DeviceMonitor

    # The server's own children are kernels, not trial workers: skip the once-a-second process walk.
    return DeviceMonitor(rate_hz, history_s, include_children=False)
