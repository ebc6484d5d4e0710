"""`build()`: turn a Workload and a TrainConfig into a `TrainStep`, applying toggles in one order.

Each toggle lives in its own module; this file only decides the order and records what was
applied. Batches reach the device with non-blocking copies and the step reads nothing back,
so with default settings neither makes the host wait (fp16's GradScaler check and the user's
own `.item()` calls still do; the sync scan names them) and CUDA events can time it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.device import resolve_device
from workbench.levers import registry
from workbench.levers.amp import ContextFactory, apply_amp
from workbench.levers.attention import apply_attention_backend
from workbench.levers.batching import apply_grad_accumulation
from workbench.levers.compile import apply_compile
from workbench.levers.compiled_autograd import apply_compiled_autograd
from workbench.levers.cuda_graphs import CudaGraphStep, apply_cuda_graphs
from workbench.levers.distributed import apply_data_parallel, grads_stay_bucket_views
from workbench.levers.memory_budget import apply_activation_memory_budget
from workbench.levers.memory_format import to_channels_last
from workbench.levers.optimizer import apply_optimizer
from workbench.levers.precision import apply_fp32_precision
from workbench.levers.record import Applied
from workbench.levers.threads import apply_intra_op_threads
from workbench.workloads.base import Batch, Workload, WorkloadError, move_batch

Mark = Callable[[str], None]


def build(
    workload: Workload, config: TrainConfig, device: str | torch.device | None = None, *, checked: bool = False
) -> TrainStep:
    """Build the model, optimizer and step for `config` on `device`; refuse what this device cannot run.

    `checked=True`: `device` is concrete and `config` was checked on it already (a resolved
    `TrialRequest`), so the check is not repeated."""
    if checked and device is not None:
        dev = torch.device(device)
    else:
        dev = resolve_device(device)
        registry.check_config(config, dev)
    torch.manual_seed(config.seed)  # same seed → same initial weights in every trial
    model = workload.model_fn().to(dev)
    applied: list[Applied] = []

    # Model changes first, each lever's `apply_model` in the registry's order (its docstring says
    # why: memory format, float8, checkpointing, offload, FlexAttention); then the wrappers, the
    # optimizer and the contexts below, in the same order.
    for lever in registry.LEVERS:
        if lever.apply_model is not None:
            record = lever.apply_model(model, config, workload)
            if record is not None:
                applied.append(record)
    # 2b. data parallelism (strategy=ddp/fsdp2): after checkpointing, whose wrapped forwards the
    #     shards must contain; before the optimizer, because FSDP2 swaps the parameters for sharded
    #     DTensors; before compile, so dynamo traces the wrapped forward (DDP: wrap, then compile).
    runnable: nn.Module = model
    if config.strategy != "none":
        runnable, record = apply_data_parallel(model, config, dev, workload.checkpoint_target)
        applied.append(record)
    # 3. optimizer once the model is final, so it holds the parameters that train. CUDA graphs
    #    need capturable Adam(W) (step counter on the device), so that is decided here already.
    optimizer, record = apply_optimizer(
        model, config.optimizer, config.optimizer_impl, config.lr, capturable=config.cuda_graphs
    )
    applied.append(record)
    accumulation = apply_grad_accumulation(config.grad_accumulation)
    if accumulation is not None:
        applied.append(accumulation)
    # 4. AMP: autocast around forward+loss, GradScaler for fp16. Autocast's cast cache must be
    #    off under CUDA graph capture.
    autocast, scaler, amp_record = apply_amp(config.amp, dev, cache_enabled=not config.cuda_graphs)
    # 5. float32 precision (matmuls, cuDNN convolutions) / attention backend: contexts scoped to
    #    the step (no global leaks). Precision is always recorded: the result must say which
    #    precision its kernels ran with, defaults included.
    precision, precision_records = apply_fp32_precision(config.matmul_precision, config.cudnn_tf32, dev)
    attention, attention_record = apply_attention_backend(config.attention_backend)
    # 5b. intra-op CPU threads: process-global too, so scoped to the step like the precision flags;
    #     always recorded, since the count PyTorch picks differs by host.
    threads, threads_record = apply_intra_op_threads(config.intra_op_threads)
    if amp_record is not None:
        applied.append(amp_record)
    applied.extend(precision_records)
    applied.append(threads_record)
    if attention_record is not None:
        applied.append(attention_record)
    # 5c. activation memory budget: a compiler setting read when the first forward call compiles
    #     forward and backward together, so it is a context around forward like 4-5 (compiled in),
    #     and scoped to the step so nothing leaks into the next trial of an inline run.
    budget, budget_record = apply_activation_memory_budget(config.activation_memory_budget)
    if budget_record is not None:
        applied.append(budget_record)
    # 6. compile last among module changes: it traces the final forward, and the contexts of
    #    steps 4-5 are active at trace time, so they are compiled in.
    if config.compile != "off":
        runnable, record = apply_compile(runnable, config)
        applied.append(record)
    step = TrainStep(
        workload, config, dev, runnable, model, optimizer, scaler, applied, autocast, precision, attention, threads
    )
    step.compile_contexts = [budget] if budget is not None else []
    # 6b. compiled autograd: a context around each backward, compiling the whole autograd graph
    #     with the forward's backend. After compile, whose compiled forward produces that graph.
    backward_compile, autograd_record = apply_compiled_autograd(config)
    if backward_compile is not None and autograd_record is not None:
        step.backward_contexts.append(backward_compile)
        applied.append(autograd_record)
    # 7. CUDA graphs capture the step exactly as it finally runs (compiled, checkpointed, AMP).
    if config.cuda_graphs:
        step.graphed, record = apply_cuda_graphs(step.eager_step, model, optimizer, dev)
        applied.append(record)
    return step


class TrainStep:
    """One optimizer step over `config.grad_accumulation` prepared micro-batches.

    `model` is what runs (an OptimizedModule under compile); `base_model` is the eager module
    underneath, whose `state_dict` keys are the model's own. The returned loss stays on the
    device: reading it is the caller's choice. The step itself adds one host sync only under
    fp16 (GradScaler's inf check, without a fused optimizer); anything else is the model's.
    """

    def __init__(
        self,
        workload: Workload,
        config: TrainConfig,
        device: torch.device,
        model: nn.Module,
        base_model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        applied: list[Applied],
        autocast: ContextFactory | None = None,
        precision: ContextFactory | None = None,
        attention: ContextFactory | None = None,
        threads: ContextFactory | None = None,
    ) -> None:
        self.workload, self.config, self.device = workload, config, device
        self.model, self.base_model, self.optimizer, self.scaler = model, base_model, optimizer, scaler
        self.applied = applied
        self._autocast, self._precision, self._attention = autocast, precision, attention
        self._threads = threads
        self.graphed: CudaGraphStep | None = None
        self.compile_contexts: list[ContextFactory] = []
        """Compiler settings entered around forward (read when the forward compiles)."""
        self.backward_contexts: list[ContextFactory] = []
        """Entered around each `.backward()` (compiled autograd)."""
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
        with _entered(self._threads):
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
        with _entered(self._precision):
            self.optimizer.zero_grad(set_to_none=self.grads_to_none)
            for batch in micro_batches:
                # The SDPA backend must hold for backward too: its backward kernel matches its forward.
                with _entered(self._attention):
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
            with _entered(self._autocast):
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
