"""`WatchCallback` for Lightning: `Trainer(callbacks=[WatchCallback(name="bev-r50")])` watches the fit
as `wb.watch` watches a plain loop.

Lightning owns the loop, so the callback marks the steps from its hooks: a step ends at the
`on_train_batch_end` after which `trainer.global_step` has advanced (with the loss the module
returned), and the time from a batch's end to the next `on_train_batch_start` is when Lightning
fetches the next batch: the data wait. With `accumulate_grad_batches=N` one optimizer step takes
N batches: it is one step, its data wait the sum of their N fetches. A validation pass
between batches is no training step: the clock restarts after it. The run ends at
`on_train_end`, or with the error at `on_exception`. Lightning is an optional dependency: only
importing this module needs it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from workbench.store import DEFAULT_STORE, StoreArg
from workbench.watch.session import Watch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - depends on the environment
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef,assignment]
    except ImportError:
        raise ImportError(
            f"workbench.watch.lightning needs Lightning ({exc}); install it with `pip install lightning`"
        ) from None


class WatchCallback(Callback):  # type: ignore[misc]
    """Watch a Lightning fit; options as `wb.watch` (`config` defaults to the module's hparams)."""

    def __init__(self, name: str | None = None, *, config: Any = None, store: StoreArg = DEFAULT_STORE,
                 **options: Any) -> None:  # fmt: skip
        self.name, self.config, self.store, self.options = name, config, store, options
        self.watch: Watch | None = None
        self._batch_ended: float | None = None
        self._marked_step = 0  # trainer.global_step at the last step marked

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        config = self.config if self.config is not None else dict(getattr(pl_module, "hparams", {}) or {})
        # No optimizer hooks: Lightning runs forward and backward inside optimizer.step (a closure),
        # so its step hooks would not bound the phases; the forward is timed by the module's hooks.
        self.watch = Watch(pl_module, None, name=self.name, config=config, store=self.store, **self.options)
        self.watch.__enter__()
        self._marked_step = trainer.global_step  # a resumed fit starts from its checkpoint's step
        self._batch_ended = time.perf_counter()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.watch is not None and self._batch_ended is not None:
            self.watch.data_wait(time.perf_counter() - self._batch_ended)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.watch is None:
            return
        if trainer.global_step != self._marked_step:  # else a micro-batch: its fetch adds to the step's data wait
            self._marked_step = trainer.global_step
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            self.watch.step(loss=loss)
        self._batch_ended = time.perf_counter()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._batch_ended = None  # no data wait across a validation pass

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.watch is not None and trainer.training:
            self.watch.reset_clock()
            self._batch_ended = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(exception)

    def _close(self, error: BaseException | None) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.__exit__(type(error) if error is not None else None, error, None)
