"""The device monitor: rate, ring-buffer bound, host figures against independent readings, NVML status."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest

from workbench.measure import forkserver
from workbench.measure.monitor import DeviceMonitor


def _proc_stat_busy() -> tuple[float, float]:
    """(busy, total) jiffies over all cores, parsed from /proc/stat by hand (not via psutil)."""
    with open("/proc/stat") as fh:
        fields = [float(x) for x in fh.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return total - idle - iowait, total


def _statm_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_rate_is_close_to_the_asked_rate() -> None:
    with DeviceMonitor(rate_hz=20, history_s=30) as monitor:
        time.sleep(0.3)  # let the thread start
        begin = time.time()
        time.sleep(2.0)
        end = time.time()
    inside = [s for s in monitor.samples() if begin <= s["t"] <= end]
    # 40 expected; a loaded shared machine may delay a few wake-ups, never add samples.
    assert 15 <= len(inside) <= 42
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(inside)]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.05, abs=0.03)


def test_default_rate_is_10_hz() -> None:
    monitor = DeviceMonitor()
    assert monitor.rate_hz == 10.0


def test_ring_buffer_keeps_only_the_newest_samples() -> None:
    monitor = DeviceMonitor(rate_hz=50, history_s=0.2)
    assert monitor.capacity == 10
    for _ in range(25):
        monitor.sample_now()
    samples = monitor.samples()
    assert len(samples) == 10
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    assert monitor.samples(since=samples[-3]["t"]) == samples[-2:]


def test_bad_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="rate_hz"):
        DeviceMonitor(rate_hz=0)
    with pytest.raises(ValueError, match="history_s"):
        DeviceMonitor(history_s=-1)


def test_process_rss_matches_proc_statm() -> None:
    ballast = bytearray(64 * 1024 * 1024)  # +64 MiB resident, so the figure is not just noise
    ballast[::4096] = b"x" * len(ballast[::4096])
    monitor = DeviceMonitor(include_children=False)
    before = _statm_rss_bytes(os.getpid())
    sample = monitor.sample_now()
    after = _statm_rss_bytes(os.getpid())
    rss = sample["host"]["rss_bytes"]
    assert rss is not None
    assert min(before, after) - 8 * 2**20 <= rss <= max(before, after) + 8 * 2**20
    assert sample["host"]["children_rss_bytes"] is None
    del ballast


def test_children_rss_counts_a_child_process() -> None:
    forkserver.stop_server()  # an idle fork server left by an earlier test is a child of ours too
    code = "b = bytearray(96 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while _statm_rss_bytes(child.pid) < 96 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.1)
        expected = _statm_rss_bytes(child.pid)
        sample = DeviceMonitor().sample_now()
        children = sample["host"]["children_rss_bytes"]
        assert children is not None
        assert children >= 0.9 * expected
        assert children <= expected + 256 * 2**20  # other children of the test process, if any
    finally:
        child.kill()
        child.wait()


def test_ram_matches_proc_meminfo() -> None:
    meminfo = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, value = line.split(":", 1)
            meminfo[key] = int(value.split()[0]) * 1024
    host = DeviceMonitor().sample_now()["host"]
    assert host["ram_total_bytes"] == meminfo["MemTotal"]
    used = meminfo["MemTotal"] - meminfo["MemAvailable"]
    assert host["ram_used_bytes"] == pytest.approx(used, abs=512 * 2**20)  # other tests allocate meanwhile


def test_cpu_utilization_agrees_with_proc_stat() -> None:
    """Mean of the monitor's samples over a window ≈ busy share computed by hand from /proc/stat."""
    spinner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"]
    )
    try:
        with DeviceMonitor(rate_hz=10, history_s=30) as monitor:
            time.sleep(0.5)
            busy0, total0 = _proc_stat_busy()
            begin = time.time()
            time.sleep(2.0)
            busy1, total1 = _proc_stat_busy()
            end = time.time()
    finally:
        spinner.kill()
        spinner.wait()
    truth = 100.0 * (busy1 - busy0) / (total1 - total0)
    inside = [s["host"]["cpu_pct"] for s in monitor.samples() if begin < s["t"] <= end]
    measured = sum(inside) / len(inside)
    assert truth >= 40.0  # the spinner keeps at least one of the cores busy
    assert measured == pytest.approx(truth, abs=15.0)
    cores = monitor.latest()["host"]["cpu_per_core_pct"]  # type: ignore[index]
    assert len(cores) == os.cpu_count()
    assert all(0.0 <= c <= 100.0 for c in cores)


def test_two_monitors_do_not_disturb_each_other() -> None:
    """psutil.cpu_percent() shares one reference point per process; ours must not."""
    first, second = DeviceMonitor(), DeviceMonitor()
    time.sleep(0.2)
    for _ in range(5):
        second.sample_now()
    time.sleep(0.3)
    sample = first.sample_now()
    assert sample["host"]["cpu_per_core_pct"]  # a real delta over ~0.5 s, not a zero-length window
    assert all(0.0 <= c <= 100.0 for c in sample["host"]["cpu_per_core_pct"])


def test_without_nvml_it_says_why_and_serves_host_metrics() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the NVML path is checked in tests/gpu")
    monitor = DeviceMonitor()
    available, reason = monitor.gpu_status()
    assert not available
    assert "NVML" in reason or "nvidia-ml-py" in reason
    assert monitor.gpu_count == 0
    sample = monitor.sample_now()
    assert sample["gpus"] == []
    assert sample["host"]["ram_total_bytes"] > 0


def test_nvml_can_be_turned_off() -> None:
    monitor = DeviceMonitor(use_nvml=False)
    assert monitor.gpu_status() == (False, "NVML disabled by the caller")


def test_stop_ends_the_thread() -> None:
    monitor = DeviceMonitor(rate_hz=50).start()
    assert monitor.running
    monitor.close()
    assert not monitor.running
    count = len(monitor.samples())
    time.sleep(0.1)
    assert len(monitor.samples()) == count


# --- NVLink: which links the field request asks for ------------------------------------


class _EighteenLinkDriver:
    """Stands in for libnvidia-ml's `nvmlDeviceGetFieldValues` only: it reads the ctypes array that
    pynvml's own wrapper packed and answers per scopeId, as nvml.h documents, for 18 links."""

    links = 18

    def __init__(self, aggregate_supported: bool = True) -> None:
        self.aggregate_supported = aggregate_supported
        self.scopes_asked: list[int] = []
        self.elapsed_s = 0.0

    def counter(self, field_id: int, link: int) -> int:
        """Cumulative KiB: link l moves (l + 1) KiB/s of TX data and 7 (l + 1) KiB/s of RX."""
        import pynvml

        per_s = 1 if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 7
        return round(per_s * (link + 1) * self.elapsed_s)

    def __call__(self, handle: object, count: object, values_ref: object) -> int:
        import pynvml

        values = values_ref._obj  # type: ignore[attr-defined]  # ctypes.byref keeps the array here
        for value in values:
            self.scopes_asked.append(int(value.scopeId))
            if value.scopeId == 0xFFFFFFFF and self.aggregate_supported:
                value.value.ullVal = sum(self.counter(value.fieldId, link) for link in range(self.links))
                value.nvmlReturn = pynvml.NVML_SUCCESS
            elif value.scopeId < self.links:
                value.value.ullVal = self.counter(value.fieldId, value.scopeId)
                value.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return pynvml.NVML_SUCCESS


@pytest.mark.parametrize("aggregate_supported", [True, False])
def test_nvlink_rate_sums_every_link_not_link_zero(monkeypatch: pytest.MonkeyPatch, aggregate_supported: bool) -> None:
    pynvml = pytest.importorskip("pynvml")
    import types

    from workbench.measure import monitor

    driver = _EighteenLinkDriver(aggregate_supported)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lambda name: driver)
    monkeypatch.setattr(monitor, "time", types.SimpleNamespace(monotonic=lambda: driver.elapsed_s))
    reader = monitor._NvmlReader(pynvml, [object()], ["18-link GPU"], "")
    driver.elapsed_s = 100.0
    assert reader._nvlink(0, reader.handles[0]) == (None, None)  # a rate needs two reads
    driver.elapsed_s = 110.0
    tx, rx = reader._nvlink(0, reader.handles[0])
    # Independent truth: 1 + 2 + ... + 18 = 171 KiB/s of TX over all links (link 0 alone: 1 KiB/s).
    assert tx == pytest.approx(171 * 1024) and rx == pytest.approx(7 * 171 * 1024)
    if aggregate_supported:
        assert set(driver.scopes_asked) == {0xFFFFFFFF}
    else:
        assert set(range(18)) <= set(driver.scopes_asked)


def test_nvlink_field_request_packs_the_all_links_scope_into_pynvml_structs() -> None:
    pynvml = pytest.importorskip("pynvml")
    from workbench.measure.monitor import nvlink_field_request

    request = nvlink_field_request(pynvml)
    values = (pynvml.c_nvmlFieldValue_t * len(request))()
    for slot, field in zip(values, request):
        slot.fieldId, slot.scopeId = field  # what pynvml.nvmlDeviceGetFieldValues does with a pair
    assert [(v.fieldId, v.scopeId) for v in values] == [
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 2**32 - 1),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 2**32 - 1),
    ]
