"""How long a rank waits for the others at a step's synchronizations, seen from its own process.

A data-parallel rank's backward ends when the gradient all-reduce (DDP) completes, and that
cannot complete before the last rank has computed its last gradient. So the time from this
rank's last gradient being ready to its backward returning is time spent waiting for the other
ranks (plus the last bucket's transfer itself): what a late rank costs everyone else. A forward
can begin with a synchronization too — DDP's broadcast of buffers (BatchNorm statistics), FSDP2's
all-gather of the root's parameters — timed from the outermost module's first pre-hook to the
model's own code (`EntryWait`). The rank
that waits least is the one that arrived last — read without comparing clocks across ranks or
hosts. The stamps come from post-accumulate-grad hooks and never synchronize: `perf_counter`
on CPU, one CUDA event per step (re-recorded by each hook, so it ends at the last gradient) on
GPU, resolved after the fact. Parameters whose gradients autograd never accumulates itself
(FSDP2's sharded parameters, compiled autograd) fire no hook: the wait is then not measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def stamp(device: torch.device, event: Any = None) -> Any:
    """Now, in the device's order: a float on CPU; a recorded CUDA event (`event`, re-recorded, or a new one)."""
    if device.type != "cuda":
        return time.perf_counter()
    event = event if event is not None else torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def elapsed_ms(start: Any, end: Any) -> float:
    """Milliseconds between two stamps (CUDA events must have completed)."""
    if isinstance(start, float):
        return (end - start) * 1000.0
    return float(start.elapsed_time(end))


def stamp_done(value: Any) -> bool:
    """Whether a stamp can be read without waiting (a float always; an event once the GPU passed it)."""
    return isinstance(value, float) or bool(value.query())


class GradReady:
    """Stamps when this step's last gradient was accumulated and when its backward ended.

    The end is stamped by an autograd-engine final callback queued from a callback: callbacks run
    in the order queued, and DDP queues the one that waits for its all-reduces (FSDP2 its root
    post-backward) during backward, so a callback queued while callbacks run comes after them all.
    `take()` hands both over and starts afresh.
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter], device: torch.device) -> None:
        self.device = device
        self._ready: Any = None
        self._ended: Any = None
        self._queued = False
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in parameters if p.requires_grad]

    def _on_grad(self, _: torch.Tensor) -> None:
        self._ready = stamp(self.device, self._ready)
        if not self._queued:
            self._queued = _queue_callback(self._queue_end)

    def _queue_end(self) -> None:
        _queue_callback(self._on_backward_end)  # queued now, it runs after every callback queued so far

    def _on_backward_end(self) -> None:
        self._ended = stamp(self.device)
        self._queued = False

    def take(self) -> tuple[Any, Any]:
        """(last gradient, backward's end) since the previous `take()`; None for what was not seen."""
        taken = (self._ready, self._ended)
        self._ready = self._ended = None
        return taken

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class EntryWait:
    """Stamps each forward's entry and the moment the model's own code starts: between them, DDP
    broadcasts buffers and FSDP2 all-gathers the root's parameters — waiting there for late ranks.

    A pre-hook put first on the outermost module runs before FSDP2's own (also a pre-hook); one put
    last on the inner module (DDP's `.module`, else the model) runs when the model's code begins."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.device = device
        inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        self._begin: Any = None
        self._pairs: list[tuple[Any, Any]] = []
        self._handles = [
            model.register_forward_pre_hook(self._enter, prepend=True),
            inner.register_forward_pre_hook(self._entered),
        ]

    def _enter(self, *_: Any) -> None:
        self._begin = stamp(self.device)

    def _entered(self, *_: Any) -> None:
        if self._begin is not None:
            self._pairs.append((self._begin, stamp(self.device)))
            self._begin = None

    def take(self) -> list[tuple[Any, Any]]:
        """The (entry, model code begins) stamps of the forwards since the previous `take()`."""
        pairs, self._pairs = self._pairs, []
        return pairs

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _queue_callback(callback: Callable[[], None]) -> bool:
    """Run `callback` when the current backward pass finishes; False where the engine cannot."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(callback)  # type: ignore[attr-defined]
        return True
    except Exception:  # no backward running, or an engine without final callbacks: the end is not seen
        return False


class SyncWaits:
    """Per step, this rank's time waiting at synchronizations: at each forward's entry ('forward'),
    the gradient sync (from its last gradient to backward's return: 'gradient') and any blocking
    collective run through `timed` ('collective')."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.device = device
        self._grads = GradReady(model.parameters(), device)
        self._entry = EntryWait(model, device)
        self._step: list[tuple[str, Any, Any]] = []
        self._steps: list[list[tuple[str, Any, Any]] | None] = []
        self._measured = False

    def forward_returned(self) -> None:
        """A forward is done: its entry's synchronization, if it had one, is counted."""
        self._step.extend(("forward", begin, end) for begin, end in self._entry.take())

    def backward_returned(self) -> None:
        """Backward is done (DDP waited for its last all-reduce inside it)."""
        ready, ended = self._grads.take()
        if ready is not None:
            self._measured = True
            self._step.append(("gradient", ready, ended if ended is not None else stamp(self.device)))

    def timed(self, collective: Callable[[], T]) -> T:
        """Run a blocking collective, counting its time as waiting (all ranks leave it together)."""
        before = stamp(self.device)
        out = collective()
        self._step.append(("collective", before, stamp(self.device)))
        return out

    def end_step(self) -> None:
        self._steps.append(self._step if self._step else None)
        self._step = []

    def resolve(self, kind: str | None = None) -> list[float | None]:
        """Each ended step's wait in ms (call after the device synchronized), all of it or one kind's
        ('forward', 'gradient', 'collective'); None where nothing was stamped."""
        return [
            None if stamps is None else sum(elapsed_ms(a, b) for k, a, b in stamps if kind in (None, k))
            for stamps in self._steps
        ]

    @property
    def gradient_sync_seen(self) -> bool:
        """Whether any gradient hook fired: without it a slow backward cannot be told from waiting."""
        return self._measured

    def close(self) -> None:
        self._grads.close()
        self._entry.close()
