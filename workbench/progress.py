"""A one-line progress display on stderr that subscribes to trial events.

Hand-written rather than tqdm: it is an event sink, not a loop wrapper, and the CLI
must run on GPU machines that have only torch and numpy and no package registry to add tqdm.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

from workbench.measure.events import Event, RoundMeasured, StepMeasured, TrialFinished, TrialStarted


class ProgressLine:
    """Callable event sink: `run_trial(..., on_event=ProgressLine())`."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, width: int = 24) -> None:
        self.enabled, self.stream, self.width = enabled, stream or sys.stderr, width
        self._label, self._total, self._warmup, self._done = "", 0, 0, 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, event: Event) -> None:
        if not self.enabled:
            return
        if isinstance(event, TrialStarted):
            from workbench.config import TrainConfig

            self._label = f"{event.workload} | {TrainConfig.from_dict(event.config).describe()}"
            self._total, self._warmup, self._done = event.warmup + event.steps, event.warmup, 0
            self._draw("starting")
        elif isinstance(event, StepMeasured):
            self._done = event.step + 1
            kind = "step" if event.timed else "warm-up"
            self._draw(f"{kind} {event.step_ms:7.1f} ms")
        elif isinstance(event, RoundMeasured):
            self._round(event)
        elif isinstance(event, TrialFinished):
            result = event.result
            median = f"median {result.median_step_ms:.1f} ms" if result.median_step_ms else result.status
            self._draw(median if result.ok else f"{result.status}: {result.message.splitlines()[0][:80]}", final=True)

    def _round(self, event: RoundMeasured) -> None:
        """One line per round: the widest interval so far against the target, and the budget."""
        widths = [w for w in event.half_widths.values() if w is not None]
        widest = f"widest ±{max(widths):.1%}" if len(widths) == len(event.half_widths) else "intervals need more rounds"
        line = (f"round {event.round} ({event.design}): {widest}, target ±{event.precision:.1%}; "
                f"{event.elapsed_s:.0f}/{event.budget_s:.0f} s")  # fmt: skip
        self.stream.write(("\r\033[K" + line) if self._tty else line + "\n")
        self.stream.flush()

    def _draw(self, note: str, final: bool = False) -> None:
        filled = int(self.width * self._done / self._total) if self._total else 0
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {self._done}/{self._total} {self._label}: {note}"
        if self._tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        elif final or self._done in (0, self._warmup):
            self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.enabled and self._tty and kind is not None:
            self.stream.write("\n")
