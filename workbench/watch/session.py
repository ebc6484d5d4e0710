"""`wb.watch(model, optimizer)`: time a user's own training loop without harming it.

In the loop only stamps are taken (perf_counter on CPU; CUDA events on GPU, never a
synchronization) and handed to the writer thread, which does everything else. Phases are
seen through hooks: forward pre/post hooks on the model, step pre/post hooks on the
optimizer; backward is the time from the end of the forward to the optimizer step (exact
for one forward per step). Misuse (a step outside the context, a watch inside a watch, no
step at all) gets one `WatchWarning` each and never an exception inside the loop.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from workbench.measure.schedstat import thread_times
from workbench.measure.syncwait import EntryWait, GradReady
from workbench.store import DEFAULT_STORE, StoreArg
from workbench.store.watch_profiles import MAX_STEPS
from workbench.watch.compiled import start_compile_counts
from workbench.watch.ending import (
    EXITED_OPEN,
    PROCESS_END_TIMEOUT_S,
    Failure,
    ProcessGuard,
    exception_failure,
    failure_message,
    is_clean_exit,
)
from workbench.watch.profiling import WatchProfile, WindowProfiler
from workbench.watch.stages import StagedBatch, carrying_stages
from workbench.watch.writer import RawStep, Writer
from workbench.workloads.stages import StageTimes

#: How long leaving the context waits for the last flush (the run is then marked ended or failed).
CLOSE_TIMEOUT_S = 5.0
_active: Watch | None = None


class WatchWarning(UserWarning):
    """A watch used in a way that cannot be measured; the job goes on regardless."""


class Watch:
    """A watched training loop; see `watch()` for the arguments."""

    def __init__(self, model: Any = None, optimizer: Any = None, *, name: str | None = None,
                 config: Any = None, store: StoreArg = DEFAULT_STORE, warmup: int = 5, flush_s: float = 1.0,
                 max_rows: int = 1024, recent: int = 512, capacity: int = 4096) -> None:  # fmt: skip
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"name must be a non-empty string naming the job, such as 'bev-r50'; got {name!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be a whole number of steps >= 0, got {warmup!r}")
        if not flush_s > 0:
            raise ValueError(f"flush_s must be a positive number of seconds, got {flush_s!r}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (its forward is timed), got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.model, self.optimizer = model, optimizer
        self.name = name.strip() if name else (Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "") or "job"
        self.config = _config_dict(config)
        self.device = _device_of(model)
        self._cuda = self.device.type == "cuda"
        self._profiler = WindowProfiler(self.device)
        self._writer = Writer(
            store,
            name=self.name,
            config=self.config,
            warmup=warmup,
            device=self.device,
            flush_s=flush_s,
            capacity=capacity,
            max_rows=max_rows,
            recent=recent,
            profiler=self._profiler,
            compile_counts=start_compile_counts(),
        )
        self.steps = 0
        self._state = "new"  # new -> active -> closed; 'inert' for a watch nested in another
        self._guard: ProcessGuard | None = None
        self._warned: set[str] = set()
        self._hooks: list[Any] = []
        self._user_steps = False
        self._start: Any = None
        self._data_s = 0.0
        self._stages: dict[str, float] = {}
        self._loaders: dict[int, tuple[Any, Iterable[Any]]] = {}
        """id(user's loader) -> (it, the copy whose batches carry their stage times): one copy per
        loader, so persistent workers persist across epochs."""
        self._forward: list[Any] = [None, None]
        self._optimizer: list[Any] = [None, None]
        self._grads: GradReady | None = None
        self._entry: EntryWait | None = None
        self._grad_sync: tuple[Any, Any] | None = None

    # --- what the user calls --------------------------------------------------------

    @property
    def run_id(self) -> int | None:
        """The stored run's id, once the writer has written it."""
        return self._writer.run_id

    @property
    def dropped_steps(self) -> int:
        """Steps not handed to the writer because it had fallen behind."""
        return self._writer.dropped_steps

    @property
    def dropped_writes(self) -> int:
        """Flushes the store refused (or could not be opened for); their rows are sent again later."""
        return self._writer.dropped_writes

    @property
    def last_profile(self) -> WatchProfile | None:
        """The newest profiled window's diagnosis and figures, once the writer has reduced it."""
        return self._writer.last_profile

    def profile(self, steps: int = 5) -> None:
        """Profile the job's next `steps` steps (after one for the profiler's start-up) and diagnose them
        as a workbench trial is; the result lands in `last_profile` and the run history. Never blocks."""
        if self._state != "active":
            self._warn("profile-outside", f"w.profile() outside `with wb.watch(...)` ('{self.name}') is ignored")
            return
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
            self._warn("profile-steps", f"w.profile(steps={steps!r}) is ignored: steps must be a whole number "
                                        f"from 1 to {MAX_STEPS} (the profiler slows every step it records)")  # fmt: skip
            return
        if not self._profiler.request(steps):
            self._warn("profile-busy", "w.profile() while a window is being profiled is ignored: one at a time")

    def __enter__(self) -> Watch:
        global _active
        if _active is not None:
            self._warn("nested", f"wb.watch('{self.name}') inside wb.watch('{_active.name}') is ignored: "
                                 "only the outer watch records; use one watch per job")  # fmt: skip
            self._state = "inert"
            return self
        _active = self
        self._install_hooks()
        self._writer.start()
        self._state = "active"
        self._start = self._stamp()
        self._guard = ProcessGuard(self._process_ends, lambda: self._writer.flush_now(PROCESS_END_TIMEOUT_S))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._state != "active":
            return
        if self.steps == 0:
            self._warn("no-step", f"wb.watch('{self.name}') saw no step: call w.step() once per training step, "
                                  "or pass the optimizer (its step() then marks each step)")  # fmt: skip
        failure = None if is_clean_exit(exc_type, exc) else exception_failure(exc_type, exc, tb)
        self._close(failure, "", CLOSE_TIMEOUT_S)

    def batches(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """The items of `iterable`, timing how long the loop waits for each (the data wait) and the
        stages its Dataset marks with `wb.stage` (in the loop, or in a DataLoader's workers)."""
        iterator = iter(self._carrying_stages(iterable))
        clock = time.perf_counter
        times = StageTimes()
        while True:
            self._profiler.open_range("data")
            begin = clock()
            try:
                with times.collecting():  # markers run here without workers
                    item = next(iterator)
            except StopIteration:
                return
            self._data_s += clock() - begin
            if isinstance(item, StagedBatch):  # made in a worker, its stage times with it
                self._add_stages(item.ms)
                item = item.batch
            if times.ms:
                self._add_stages(times.ms)
                times.ms = {}
            yield item

    def _carrying_stages(self, iterable: Iterable[Any]) -> Iterable[Any]:
        kept = self._loaders.get(id(iterable))
        if kept is not None and kept[0] is iterable:
            return kept[1]
        carrying = carrying_stages(iterable)
        if carrying is not iterable:  # only copies are kept: a generator per epoch is not held on to
            self._loaders[id(iterable)] = (iterable, carrying)
        return carrying

    def _add_stages(self, ms: dict[str, float]) -> None:
        for name, value in ms.items():
            self._stages[name] = self._stages.get(name, 0.0) + value

    def data_wait(self, seconds: float) -> None:
        """Add time the loop waited for its next batch, measured by the caller (a framework's hooks, where
        `batches()` cannot wrap the loader); it counts toward the current step's data wait."""
        if self._state == "active" and seconds > 0:
            self._data_s += float(seconds)

    def reset_clock(self) -> None:
        """Start the next step's clock now: the time since the last step (an evaluation pass, a checkpoint
        save) is not part of any training step."""
        if self._state == "active":
            self._start, self._data_s, self._stages = self._stamp(), 0.0, {}
            self._forward, self._optimizer = [None, None], [None, None]

    def step(self, loss: Any = None) -> None:
        """Mark the end of one training step (optionally with its loss: a float or a tensor, read later)."""
        if self._state != "active":
            if self._state != "inert":
                self._warn("outside", f"w.step() outside `with wb.watch(...)` ('{self.name}') is ignored: "
                                      "call it inside the with-block, once per training step")  # fmt: skip
            return
        if not self._user_steps:
            self._user_steps = True
            if self.steps:  # the optimizer hook marked this step already: from now on only step() marks
                self._start = self._stamp()
                return
        self._mark(loss)

    # --- inside -------------------------------------------------------------------

    def _close(self, failure: Failure | None, message: str, timeout_s: float) -> None:
        """Stop watching and write the run's end: failed with `failure`, or ended with `message`."""
        global _active
        self._state = "closed"
        _active = None
        for handle in self._hooks:
            handle.remove()
        if self._grads is not None:
            self._grads.close()
        if self._entry is not None:
            self._entry.close()
        self._profiler.abandon()
        self._writer.close(failure_message(failure) if failure else message, timeout_s, failure)
        if self._guard is not None:
            self._guard.release()

    def _process_ends(self, failure: Failure | None) -> None:
        """The process is ending (an unhandled exception, a SIGTERM, its exit) with this watch open."""
        if self._state == "active":
            self._close(failure, EXITED_OPEN, PROCESS_END_TIMEOUT_S)
        else:  # already closing (a SIGTERM while leaving the block): let that last write finish
            self._writer.wait(PROCESS_END_TIMEOUT_S)

    def _mark(self, loss: Any) -> None:
        end = self._stamp()
        self.steps += 1
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self._cuda else None
        forward = (self._forward[0], self._forward[1]) if self._forward[1] is not None else None
        optimizer = (self._optimizer[0], self._optimizer[1]) if self._optimizer[1] is not None else None
        if self._grads is not None and self._grad_sync is None:  # no optimizer hook took them
            self._grad_sync = self._grads.take()
        entry_waits = self._entry.take() if self._entry is not None else []
        raw = RawStep(
            self.steps,
            time.time(),
            self._start,
            end,
            self._data_s,
            forward,
            optimizer,
            loss,
            peak,
            self._grad_sync,
            entry_waits,
            thread_times(),
            self._stages or None,
        )
        self._writer.offer(raw)
        self._start, self._data_s, self._stages = end, 0.0, {}
        self._forward, self._optimizer, self._grad_sync = [None, None], [None, None], None
        window = self._profiler.after_step(self.steps)
        if window is not None:
            self._writer.offer_profile(window)

    def _stamp(self) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _install_hooks(self) -> None:
        if self.model is not None:
            # First among the pre-hooks, so the forward holds any synchronization at its entry (as DDP's does).
            self._hooks.append(self.model.register_forward_pre_hook(self._forward_begins, prepend=True))
            self._hooks.append(self.model.register_forward_hook(self._forward_ends))
        if self.model is not None:
            # From the last gradient to backward's end, a data-parallel rank waits for the others in the
            # gradient all-reduce (the rank that waits least is the one they all wait for).
            self._grads = GradReady(self.model.parameters(), self.device)
            self._entry = EntryWait(self.model, self.device)
        if self.optimizer is not None:
            self._hooks.append(self.optimizer.register_step_pre_hook(self._optimizer_begins))
            self._hooks.append(self.optimizer.register_step_post_hook(self._optimizer_ends))

    def _forward_begins(self, *_: Any) -> None:
        if self._forward[0] is None:
            self._forward[0] = self._stamp()
        self._profiler.open_range("forward")

    def _forward_ends(self, *_: Any) -> None:
        self._forward[1] = self._stamp()
        self._profiler.open_range("backward")

    def _optimizer_begins(self, *_: Any) -> None:
        self._optimizer[0] = self._stamp()
        if self._grads is not None:
            self._grad_sync = self._grads.take()
        self._profiler.open_range("optimizer")

    def _optimizer_ends(self, *_: Any) -> None:
        self._optimizer[1] = self._stamp()
        self._profiler.close_range()
        if not self._user_steps:
            self._mark(None)

    def _warn(self, kind: str, message: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        warnings.warn(message, WatchWarning, stacklevel=3)


def watch(model: Any = None, optimizer: Any = None, **options: Any) -> Watch:
    """Watch a training loop: `with wb.watch(model, optimizer, name="bev-r50") as w:` ...

    Per step: step time, data wait (through `w.batches(loader)`), forward / backward /
    optimizer phases (through hooks on `model` and `optimizer`), allocator peak memory on
    CUDA, the loss given to `w.step(loss=...)`; per flush window: host/GPU utilization and
    GPU energy. Stored as a run of kind 'watch' while it runs. Options: `name`, `config`
    (the job's own settings: a dict, dataclass or argparse Namespace), `store` (a path, a
    Store, None for none; default: the run history), `warmup` (steps left out of the
    steady step time, default 5), `flush_s` (seconds between writes, default 1).
    """
    return Watch(model, optimizer, **options)


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise TypeError(f"config must be a dict, a dataclass or an object with attributes (argparse.Namespace); "
                    f"got {type(config).__name__}")  # fmt: skip


def _device_of(model: Any) -> torch.device:
    if model is not None:
        for parameter in model.parameters():
            return parameter.device
    return torch.device("cpu")
