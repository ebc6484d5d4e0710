"""The fake step: a built train step whose parameters, buffers and batches are fake CPU tensors,
measured under the same MemTracker wrapper as real trials."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError, TrainConfig
from workbench.estimate.allocator import (
    CUDA_SMALL_SIZE,
    cuda_block_bytes,
    cuda_workspace_bytes,
    device_memory_bytes,
    expandable_segments_configured,
    is_cuda_device_name,
    workspace_error_bytes,
)
from workbench.estimate.results import BatchSizeSearch, MemoryEstimate, default_budget, search_batch_size
from workbench.workloads import Workload, load_workload

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


class FakeStep:
    """A built train step whose parameters, buffers and batches are fake tensors."""

    def __init__(self, step: TrainStep, fake_mode: Any, make_batch: Callable[[int], Any], notes: list[str]) -> None:
        self.step, self.fake_mode, self.make_batch, self.notes = step, fake_mode, make_batch, notes
        self.default_batch_size = step.workload.effective_batch_size(step.config)
        self._warm = False
        self._readings: dict[tuple[bool, int], tuple[Any, int]] = {}
        """(rounded for CUDA, batch size) → (tracked reading, tensors over 1 MiB): one fake step per size."""

    def run(self, batch_size: int) -> Any:
        """One optimizer step on fake micro-batches of `batch_size`."""
        micro = [
            self.step.prepare_batch(self.make_batch(batch_size)) for _ in range(self.step.config.grad_accumulation)
        ]
        return self.step(micro)

    def estimate(self, device_name: str, batch_size: int) -> MemoryEstimate:
        from workbench.measure.memory import track_step_memory

        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        cuda = is_cuda_device_name(device_name)
        cached = self._readings.get((cuda, batch_size))
        if cached is None:
            large: list[int] = []
            expandable = expandable_segments_configured()

            def block_bytes(nbytes: int) -> int:
                if nbytes > CUDA_SMALL_SIZE:
                    large.append(nbytes)
                return cuda_block_bytes(nbytes, expandable_segments=expandable)

            with self.fake_mode:
                if not self._warm:  # optimizer state exists from the first step on: measure a steady step
                    self.run(batch_size)
                    self._warm = True
                reading = track_step_memory(
                    self.step.model,
                    self.step.optimizer,
                    lambda: self.run(batch_size),
                    round_bytes=block_bytes if cuda else None,
                )
            cached = self._readings[(cuda, batch_size)] = (reading, len(large))
        reading, large_count = cached
        workspace = cuda_workspace_bytes(device_name) if cuda else 0
        # Every tensor over 1 MiB the step allocates may get a reused block up to 1 MiB off its own
        # size (more than counts only those live at the peak, so this bounds it from above).
        bound = large_count * CUDA_SMALL_SIZE + workspace_error_bytes(device_name) if cuda else 0
        notes = list(self.notes)
        if cuda:
            notes.append(
                f"error bound ±{bound / 2**20:.0f} MiB: up to 1 MiB per tensor over 1 MiB ({large_count} allocated "
                f"in the step) where the allocator reuses a block of another size, and the cuBLAS/cuBLASLt "
                "workspaces, whose size and lifetime depend on the PyTorch version and CUBLAS_WORKSPACE_CONFIG"
            )
        return MemoryEstimate(
            device_name=device_name,
            batch_size=batch_size,
            peak_bytes=int(reading.peak_bytes or 0) + workspace,
            tensor_peak_bytes=None if cuda else int(reading.peak_bytes or 0),
            breakdown=dict(reading.breakdown or {}),
            workspace_bytes=workspace,
            device_memory_bytes=device_memory_bytes(device_name),
            modules=dict(reading.modules or {}),
            notes=notes,
            error_bound_bytes=bound,
        )

    def max_batch_size(
        self, device_name: str, memory_budget: int | None = None, limit: int = 1 << 16
    ) -> BatchSizeSearch:
        """The largest micro-batch whose estimate fits `memory_budget` (default: 90% of the device)."""
        budget = memory_budget if memory_budget is not None else default_budget(device_name)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ConfigError(f"memory_budget must be a positive number of bytes, got {budget!r}")
        probes: dict[int, MemoryEstimate] = {}
        peaks: dict[int, int] = {}

        def fits(size: int) -> bool:
            probes[size] = self.estimate(device_name, size)
            peaks[size] = probes[size].peak_bytes
            return peaks[size] <= budget

        best = search_batch_size(fits, peaks, budget, limit)
        return BatchSizeSearch(
            device_name=device_name,
            memory_budget_bytes=budget,
            max_batch_size=best,
            estimate=probes.get(best),
            probes={size: e.peak_bytes for size, e in sorted(probes.items())},
        )


@contextmanager
def fake_train_step(
    workload: Workload | str, config: TrainConfig, *, preset: str = "tiny", cuda: bool = False
) -> Iterator[FakeStep]:
    """Build `config`'s step on the CPU, then swap its tensors for fake ones (`cuda`: as a GPU would run it).

    The model is built for real (a fake model cannot be moved with `.to()`: PyTorch swaps
    fake parameters and refuses, "Cannot swap t2 because it has weakref") and then faked, so
    real memory is held only for the parameters, briefly.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.levers import capabilities
    from workbench.levers.build import build

    wl = load_workload(workload, preset=preset, **config.extra) if isinstance(workload, str) else workload
    cpu_config, notes = cpu_equivalent(config, cuda=cuda)
    capabilities("cpu")  # probes run real ops: run them before fake mode, once (cached)
    sample = _sample_batch(wl, cpu_config)
    rng = torch.get_rng_state()
    try:
        step = build(wl, cpu_config, "cpu")
        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        _fakeify(step, fake_mode)
        yield FakeStep(step, fake_mode, lambda size: _fake_batch(sample, size, fake_mode), notes)
    finally:
        torch.set_rng_state(rng)


def cpu_equivalent(config: TrainConfig, *, cuda: bool = False) -> tuple[TrainConfig, list[str]]:
    """The config as the CPU can build it, with a note for each toggle whose memory effect is not modelled.

    `cuda`: the estimate is for a GPU, so optimizer_impl='default' is built as PyTorch's choice
    there (foreach, whose temporaries the for-loop it picks on CPU does not hold).
    """
    changes: dict[str, Any] = {}
    notes: list[str] = []
    if config.optimizer_impl == "default" and cuda:
        from workbench.levers.optimizer import default_impl_on

        changes["optimizer_impl"] = default_impl_on("cuda")
    if not config.cudnn_tf32:
        changes["cudnn_tf32"] = True  # convolution precision; no effect on memory
    if config.compile != "off":
        changes.update(compile="off", compile_backend="inductor", compile_fullgraph=False, compile_dynamic=None)
        notes.append("estimated as eager: compile usually lowers activation memory (fusion), so this is an upper bound")
    if config.cuda_graphs:
        changes["cuda_graphs"] = False
        notes.append("CUDA graphs keep the captured step's memory in a private pool; not modelled")
    if config.matmul_precision != "highest":
        changes["matmul_precision"] = "highest"
    if config.pin_memory:
        changes["pin_memory"] = False
    if config.attention_backend != "auto":
        changes["attention_backend"] = "auto"
        notes.append("attention estimated with the CPU kernel; GPU flash/efficient kernels keep similar state")
    if config.optimizer_impl == "fused":
        changes["optimizer_impl"] = "foreach"
        notes.append("fused optimizer estimated as foreach (same state; foreach may hold more temporaries)")
    if config.num_workers:
        changes.update(num_workers=0, prefetch_factor=None, persistent_workers=False)
    cpu = dataclasses.replace(config, **changes) if changes else config
    return cpu, notes


def _fakeify(step: TrainStep, fake_mode: Any) -> None:
    """Replace every parameter and buffer of the built model with a fake twin, and re-point the optimizer."""
    from torch import nn

    mapping: dict[int, nn.Parameter] = {}
    for module in step.base_model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in mapping:
                mapping[id(param)] = nn.Parameter(fake_mode.from_tensor(param), requires_grad=param.requires_grad)
            module._parameters[name] = mapping[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = fake_mode.from_tensor(buffer)
    for group in step.optimizer.param_groups:
        group["params"] = [mapping[id(p)] for p in group["params"]]


def _sample_batch(workload: Workload, config: TrainConfig) -> Any:
    """One real batch of a single sample (cheap), whose shapes the fake batches scale up."""
    one = dataclasses.replace(config, batch_size=1, num_workers=0, prefetch_factor=None, persistent_workers=False)
    return next(iter(workload.batches(one)))


def _fake_batch(sample: Any, batch_size: int, fake_mode: Any) -> Any:
    """The sample batch at `batch_size`: leading dimension 1 becomes `batch_size`, as fake tensors."""
    import torch

    from workbench.workloads import map_tensors

    def grow(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or tensor.shape[0] != 1:
            return fake_mode.from_tensor(tensor)
        return torch.empty((batch_size, *tensor.shape[1:]), dtype=tensor.dtype)  # fake: called under fake_mode

    return map_tensors(sample, grow)
