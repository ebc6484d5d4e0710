"""`build()`: turn a Workload and a TrainConfig into a `TrainStep`, applying toggles in one order.

Each lever lives in its own module and applies itself to the step; the registry holds the
order. This file runs them in that order and runs the step they made. Batches reach the device with non-blocking copies and the step reads nothing back,
so with default settings neither makes the host wait (fp16's GradScaler check and the user's
own `.item()` calls still do; the sync scan names them) and CUDA events can time it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.device import resolve_device
from workbench.levers import registry
from workbench.levers.amp import ContextFactory
from workbench.levers.cuda_graphs import CudaGraphStep
from workbench.levers.distributed import grads_stay_bucket_views
from workbench.levers.memory_format import to_channels_last
from workbench.levers.record import Applied
from workbench.workloads.base import Batch, Workload, WorkloadError, move_batch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

Mark = Callable[[str], None]


def build(
    workload: Workload, config: TrainConfig, device: str | torch.device | None = None, *, checked: bool = False
) -> TrainStep:
    """Build the model, optimizer and step for `config` on `device`; refuse what this device cannot run.

    Every lever applies itself to the step in the registry's order (`registry.LEVERS`, whose
    docstring says why that order). `checked=True`: `device` is concrete and `config` was checked
    on it already (a resolved `TrialRequest`), so the check is not repeated."""
    if checked and device is not None:
        dev = torch.device(device)
    else:
        dev = resolve_device(device)
        registry.check_config(config, dev)
    torch.manual_seed(config.seed)  # same seed → same initial weights in every trial
    step = TrainStep(workload, config, dev, workload.model_fn().to(dev))
    for lever in registry.LEVERS:
        if lever.apply is not None:
            lever.apply(step)
    if not hasattr(step, "optimizer"):
        raise RuntimeError("no lever set the step's optimizer: the registry must list the optimizer lever")
    return step


class TrainStep:
    """One optimizer step over `config.grad_accumulation` prepared micro-batches.

    `model` is what runs (an OptimizedModule under compile, a DDP/FSDP wrapper); `base_model` is
    the eager module underneath, whose `state_dict` keys are the model's own. The levers fill in
    the rest while `build()` applies them. The returned loss stays on the device: reading it is
    the caller's choice. The step itself adds one host sync only under fp16 (GradScaler's inf
    check, without a fused optimizer); anything else is the model's.
    """

    optimizer: torch.optim.Optimizer
    """Set by the optimizer lever, once the model is final."""

    def __init__(self, workload: Workload, config: TrainConfig, device: torch.device, model: nn.Module) -> None:
        self.workload, self.config, self.device = workload, config, device
        self.model: nn.Module = model
        self.base_model: nn.Module = model
        self.applied: list[Applied] = []
        self.device_mesh: DeviceMesh | None = None
        """The dp × tp mesh, when tensor parallelism built one (FSDP2 then shards over its dp)."""
        self.scaler: torch.amp.GradScaler | None = None
        self.autocast: ContextFactory | None = None
        """Around forward and loss (AMP)."""
        self.precision: ContextFactory | None = None
        """Around the whole step (float32 precision flags)."""
        self.attention: ContextFactory | None = None
        """Around each micro-batch's forward and backward (a forced SDPA kernel)."""
        self.threads: ContextFactory | None = None
        """Around the whole step, CUDA-graph replays included (intra-op threads)."""
        self.compile_contexts: list[ContextFactory] = []
        """Compiler settings entered around forward (read when the forward compiles)."""
        self.backward_contexts: list[ContextFactory] = []
        """Entered around each `.backward()` (compiled autograd)."""
        self.graphed: CudaGraphStep | None = None
        self.on_device: list[Callable[[Batch], Batch]] = []
        """Applied to each batch once it is on the device (the uint8 images' normalization)."""
        # Gradients are dropped each step (backward allocates them only as needed), except where
        # they are DDP bucket views, which must survive to save the copy.
        self.grads_to_none = not grads_stay_bucket_views(config)

    def prepare_batch(self, batch: Batch) -> Batch:
        """Move a batch to the device in the model's layout, without making the host wait.

        A blocking host→device copy synchronizes the stream every step. Non-blocking is correct
        from pageable memory too: CUDA stages a pageable source before the call returns, so the
        batch may be freed or reused at once (pinned memory also lets the DMA overlap compute).
        """
        batch = move_batch(batch, self.device, non_blocking=self.device.type == "cuda")
        for finish in self.on_device:
            batch = finish(batch)
        return to_channels_last(batch) if self.config.channels_last else batch

    def __call__(self, micro_batches: Sequence[Batch], mark: Mark | None = None) -> torch.Tensor:
        """One optimizer step; returns the mean micro-batch loss, detached, on the device.

        `mark(phase)` is called after each phase ends: 'forward' and 'backward' per micro-batch,
        then 'optimizer'; under CUDA graphs the replay is one phase, 'step'.
        """
        if len(micro_batches) != self.config.grad_accumulation:
            raise ValueError(
                f"expected {self.config.grad_accumulation} micro-batches (grad_accumulation), got {len(micro_batches)}"
            )
        with _entered(self.threads):
            if self.graphed is not None:
                loss = self.graphed(micro_batches)
                if mark is not None:
                    mark("step")
                return loss
            return self.eager_step(micro_batches, mark)

    def eager_step(self, micro_batches: Sequence[Batch], mark: Mark | None = None) -> torch.Tensor:
        """The step itself, without CUDA graphs (which capture exactly this function)."""
        count = len(micro_batches)
        total: torch.Tensor | None = None
        with _entered(self.precision):
            self.optimizer.zero_grad(set_to_none=self.grads_to_none)
            for batch in micro_batches:
                # The SDPA backend must hold for backward too: its backward kernel matches its forward.
                with _entered(self.attention):
                    loss = self.forward_loss(batch)
                    if mark is not None:
                        mark("forward")
                    scaled = loss / count  # mean over micro-batches = gradient of the whole batch
                    with ExitStack() as stack:
                        for factory in self.backward_contexts:
                            stack.enter_context(factory())
                        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                if mark is not None:
                    mark("backward")
                detached = loss.detach().float()
                total = detached if total is None else total + detached
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            if mark is not None:
                mark("optimizer")
        assert total is not None
        return total / count

    def forward_loss(self, batch: Batch) -> torch.Tensor:
        """Forward and loss of one prepared micro-batch under autocast and the compiler settings;
        the loss keeps its autograd graph (what backward will need is saved on it)."""
        with ExitStack() as stack:
            for factory in self.compile_contexts:
                stack.enter_context(factory())
            with _entered(self.autocast):
                output = self.workload.forward_fn(self.model, batch)
                return scalar_loss(self.workload.loss_fn(output, batch), self.workload.name)

    def describe(self) -> str:
        """What was applied, one line per toggle."""
        return "\n".join(str(a) for a in self.applied)


def _entered(factory: ContextFactory | None) -> AbstractContextManager[object]:
    """A fresh context from an optional toggle's factory; a no-op when the toggle is off."""
    return factory() if factory is not None else nullcontext()


def scalar_loss(loss: object, workload_name: str) -> torch.Tensor:
    """The loss, or a WorkloadError saying what loss_fn returned instead (a None or a per-sample
    tensor would otherwise fail later as an unrelated TypeError in the division or backward)."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
        return loss
    got = f"a {loss.dtype} tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else repr(loss)[:60]
    raise WorkloadError(
        f"workload '{workload_name}': loss_fn must return a scalar tensor (one float value to minimise), got {got}; "
        "return e.g. torch.nn.functional.cross_entropy(output, target), or .mean() of a per-sample loss"
    )
