"""The host-load figures against a load we make ourselves: processes that keep cores busy."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from workbench.measure.hostload import ArmMeter, HostLoad

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def test_another_process_keeping_a_core_busy_shows_as_about_one_other_core() -> None:
    load = HostLoad().start()
    # Started in its own session and never waited for before the reading: not ours, so "other".
    busy = subprocess.Popen([sys.executable, "-c", BUSY.format(s=2.5)], start_new_session=True)
    time.sleep(2.0)
    reading = load.other_cores()
    busy.wait()
    assert reading is not None
    assert reading >= 0.6, f"a process spinning on one core for the whole window read as {reading:.2f} other cores"


def test_a_window_too_short_to_mean_anything_reads_none() -> None:
    assert HostLoad().start().other_cores() is None
    assert HostLoad().other_cores() is None


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _arm(burners: int) -> tuple[float, float]:
    """One 'arm': this process spins for 1 s with `burners` other processes spinning beside it."""
    others = [
        subprocess.Popen([sys.executable, "-c", BUSY.format(s=3.0)], start_new_session=True) for _ in range(burners)
    ]
    time.sleep(0.5 if burners else 0.0)  # past the interpreters' start-up
    meter = ArmMeter()
    _spin(1.0)
    other, wait = meter.finish()
    for proc in others:
        proc.kill()
        proc.wait()
    assert other is not None and wait is not None, "schedstat or /proc/stat unreadable on Linux"
    return other, wait


def test_an_arm_timed_beside_burners_reads_their_cores_and_our_wait() -> None:
    """As many processes spinning as the host has cores, while we spin: most of the cores read as
    other work's (2 x 2/3 on 2 cores), and our thread waits for a core about 1 / (cores + 1) of the
    time more than without them. The host is shared: someone else's work can already hold the
    cores in the arm without burners (other cores then read high in both arms, which is why
    the other-cores figure is checked on the busy arm alone, while our wait still rises with
    more runnable processes), or land in one arm only, so the pair is tried up to three times."""
    cores = os.cpu_count() or 2
    seen = []
    for _ in range(3):
        quiet, busy = _arm(0), _arm(cores)
        seen.append((quiet, busy))
        if busy[0] >= 0.5 * cores and busy[1] - quiet[1] >= 0.3 / (cores + 1):
            return
    raise AssertionError(f"burners barely showed: (other cores, our wait per s) without, with {seen}")
