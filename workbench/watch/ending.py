"""How a watched process ends, told to its run even when it never leaves the `with wb.watch(...)` block.

Leaving the block with an exception is the easy case (`__exit__` sees it). The others leave no
callback: a Hugging Face Trainer that raises mid-run, a user who enters a watch and never exits it,
a SIGTERM from torchrun or a job scheduler. While a watch is open, `ProcessGuard` chains onto
`sys.excepthook`, `threading.excepthook`, `atexit` and (from the main thread only: Python allows no
other) the SIGTERM handler; each asks the watch to write its end, waiting at most
`PROCESS_END_TIMEOUT_S`, never raising, and then hands on to whatever was there before, so the
process ends exactly as it would have without us (a SIGTERM with no handler of the user's still
kills it by the signal: exit status -15). A process killed outright (SIGKILL) runs none of this:
its run is read as 'killed' once its writer has been silent (`workbench.store.watched`).

A failure is stored as the distributed trial's `RankFailure` fields (how, when, the exception and
the user's `file:line`), so a watched torchrun job names its first failed rank with the same rule
and words as a distributed trial does.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from workbench.distributed.failures import RankFailure
from workbench.usererror import is_library_file

#: The most an excepthook, atexit or SIGTERM flush holds the dying process up.
PROCESS_END_TIMEOUT_S = 2.0
#: The message of a run whose process exited normally with its watch still open.
EXITED_OPEN = "the process exited with the watch still open (it was never closed)"

Failure = dict[str, Any]
"""What a run's summary keeps under 'failure': `RankFailure` fields less the rank (the run has it)."""


def exception_failure(exc_type: type[BaseException], exc: BaseException | None, tb: TracebackType | None) -> Failure:
    """An exception that ended the watched loop: its type and text, and the user's line that raised it."""
    text = str(exc) if exc is not None else ""
    exception = f"{exc_type.__name__}: {text}" if text else exc_type.__name__
    if tb is None and exc is not None:
        tb = exc.__traceback__  # a framework's callback hands the exception without its traceback
    return {"how": "exception", "died_at": time.time(), "exception": exception[:500], "where": raise_site(tb)}


def signal_failure(signum: int) -> Failure:
    """A signal that is about to end the process (told in `describe_exit`'s words through the exit code)."""
    return {"how": "signal", "died_at": time.time(), "exitcode": -int(signum)}


def failure_message(failure: Failure) -> str:
    """The run's message for a failure: the same words a distributed trial uses for a failed rank."""
    return RankFailure.from_dict({**failure, "rank": 0}).cause


def is_clean_exit(exc_type: type[BaseException] | None, exc: BaseException | None) -> bool:
    """No exception, or `sys.exit()` / `sys.exit(0)`: the job chose to end, and ended well."""
    if exc_type is None:
        return True
    return issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (None, 0)


def raise_site(tb: TracebackType | None) -> str | None:
    """'file:line in function' of the innermost frame in the user's own code (not torch's, ours, the
    standard library's or an installed package's); the innermost frame when none is theirs."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    if not frames:
        return None
    frame = next((f for f in reversed(frames) if not is_library_file(f.filename)), frames[-1])
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


class ProcessGuard:
    """The process-end hooks of one open watch; `release()` takes them out again.

    `end(failure)` is the watch's own: it writes the run's end (`failure` None for a clean exit)
    within `PROCESS_END_TIMEOUT_S`; `flush()` writes the steps so far, the run going on. Only the
    thread that opened the watch can fail it: an exception that kills another thread (a logger's,
    a prefetcher's) leaves the loop running. A SIGTERM that the user handles is theirs to act on
    (Lightning's handler, say, stops the fit gracefully): the steps so far are written, then their
    handler runs, and the run ends however the process then ends.
    """

    def __init__(self, end: Callable[[Failure | None], None], flush: Callable[[], None]) -> None:
        self._end, self._flush = end, flush
        self._pid = os.getpid()  # a forked DataLoader worker inherits the hooks: they do nothing there
        self._thread = threading.current_thread()
        self._released = False
        self._excepthook = sys.excepthook
        self._threading_hook = threading.excepthook
        sys.excepthook = self._on_exception
        threading.excepthook = self._on_thread_exception
        atexit.register(self._on_exit)
        self._sigterm: Any = None
        if self._thread is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous is not signal.SIG_IGN:  # a process told to ignore SIGTERM goes on doing so
                self._sigterm = signal.SIG_DFL if previous is None else previous
                signal.signal(signal.SIGTERM, self._on_sigterm)

    def release(self) -> None:
        """Restore what was there before, where it is still ours (a hook set after ours is kept, and
        ours then only passes through to the one it chained)."""
        if self._released:
            return
        self._released = True
        if sys.excepthook == self._on_exception:
            sys.excepthook = self._excepthook
        if threading.excepthook == self._on_thread_exception:
            threading.excepthook = self._threading_hook
        atexit.unregister(self._on_exit)
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    signal.signal(signal.SIGTERM, self._sigterm)
            except (ValueError, OSError):  # interpreter shutting down: the process ends anyway
                pass

    # --- the hooks ------------------------------------------------------------------

    def _on_exception(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if self._thread is threading.main_thread():
            self._tell(exception_failure(exc_type, exc, tb))
        self._excepthook(exc_type, exc, tb)

    def _on_thread_exception(self, args: Any) -> None:
        if args.thread is self._thread and not is_clean_exit(args.exc_type, args.exc_value):
            self._tell(exception_failure(args.exc_type, args.exc_value, args.exc_traceback))
        self._threading_hook(args)

    def _on_exit(self) -> None:
        self._tell(None)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        previous = self._sigterm
        if callable(previous):
            self._tell(None, flush_only=True)
            previous(signum, frame)
            return
        self._tell(signal_failure(signum))
        # No handler of the user's: die of the signal, as the process would have without the watch.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _tell(self, failure: Failure | None, flush_only: bool = False) -> None:
        """Hand the end to the watch; whatever goes wrong there, the process ends as it was going to."""
        if self._released or os.getpid() != self._pid:
            return
        try:
            if flush_only:
                self._flush()
            else:
                self._end(failure)
        except BaseException:  # never raise while the process is dying
            pass
