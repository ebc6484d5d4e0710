"""`WatchCallback` for the Hugging Face `Trainer`: `Trainer(..., callbacks=[WatchCallback(name="vlm")])`
watches the training as `wb.watch` watches a plain loop.

The Trainer owns the loop, so the callback marks the steps from its hooks: an optimizer step
ends at `on_step_end`, and the Trainer fetches the next step's batches between that and the next
`on_step_begin`: the data wait. Evaluation and checkpoint saves are no training step: the clock
restarts after them. The loss is the one the Trainer logs (every `logging_steps`), given to the
step after it is logged. `transformers` is an optional dependency: only importing this module
needs it. A crash inside the Trainer has no callback: the exception leaves `train()` with the watch
still open, and the watch's own exception hook (`workbench.watch.ending`) writes every step run so
far and marks the run failed with the exception before the process ends.
"""

from __future__ import annotations

import time
from typing import Any

from workbench.store import DEFAULT_STORE, StoreArg
from workbench.watch.session import Watch

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"workbench.watch.hf needs Hugging Face transformers ({exc}); install it with `pip install transformers`"
    ) from None


class WatchCallback(TrainerCallback):  # type: ignore[misc]
    """Watch a Trainer's training; options as `wb.watch` (`config` defaults to the TrainingArguments)."""

    def __init__(self, name: str | None = None, *, config: Any = None, store: StoreArg = DEFAULT_STORE,
                 **options: Any) -> None:  # fmt: skip
        self.name, self.config, self.store, self.options = name, config, store, options
        self.watch: Watch | None = None
        self._step_ended: float | None = None
        self._loss: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:  # fmt: skip
        config = self.config if self.config is not None else _arguments(args)
        while hasattr(optimizer, "optimizer"):  # accelerate's AcceleratedOptimizer wraps the torch one
            optimizer = optimizer.optimizer
        self.watch = Watch(model, optimizer, name=self.name, config=config, store=self.store, **self.options)
        self.watch.__enter__()
        self._step_ended = time.perf_counter()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watch is not None and self._step_ended is not None:
            self.watch.data_wait(time.perf_counter() - self._step_ended)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watch is None:
            return
        loss, self._loss = self._loss, None
        self.watch.step(loss=loss)
        self._step_ended = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and isinstance(logs.get("loss"), (int, float)):
            self._loss = float(logs["loss"])
        self._restart()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.__exit__(None, None, None)

    def _restart(self) -> None:
        """After logging, evaluation or a save, which run between a step's end and the next batch fetch."""
        if self.watch is not None:
            self.watch.reset_clock()
            self._step_ended = time.perf_counter()


def _arguments(args: Any) -> dict[str, Any]:
    try:
        return {k: v for k, v in args.to_dict().items() if isinstance(v, (str, int, float, bool)) or v is None}
    except Exception:  # the arguments are context for the history, never a reason to fail the training
        return {}
