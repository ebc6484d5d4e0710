"""The host-load figure against a load we make ourselves: a process that keeps one core busy."""

from __future__ import annotations

import subprocess
import sys
import time

from workbench.measure.hostload import HostLoad

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
