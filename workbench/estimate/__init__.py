"""Peak training memory of a config on a GPU you may not have: fake tensors plus an allocator model.

The step runs on *fake* CPU tensors (shapes, dtypes and aliasing, no data; a fake `cuda`
device crashes CPU builds of torch) under the same MemTracker wrapper that measures real
trials, so the figure is the tensor-level peak of a steady step: parameters, gradients,
optimizer state, activations and temporaries. For a CUDA device the CUDA caching
allocator's block sizes are applied per storage (512-byte rounding, and a large segment
left whole when splitting would leave <= 1 MiB) and its cuBLAS workspaces are added, which
is what `torch.cuda.max_memory_allocated` counts. What depends on allocation history, the
PyTorch version or its environment is carried as `error_bound_bytes`. Not modelled:
fragmentation (reserved > allocated), the CUDA context, and what compile/CUDA graphs
change — those are named in each estimate's notes.
"""

from __future__ import annotations

from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.estimate.allocator import (
    CUBLAS_HANDLES,
    CUBLAS_WORKSPACE_DEFAULT,
    CUBLAS_WORKSPACE_HOPPER,
    CUBLASLT_WORKSPACE_DEFAULT_KIB,
    CUDA_MIN_BLOCK,
    CUDA_MIN_LARGE_ALLOC,
    CUDA_ROUND_LARGE,
    CUDA_SMALL_SIZE,
    DEFAULT_USABLE_FRACTION,
    cublas_workspace_bytes,
    cublaslt_workspace_bytes,
    cuda_block_bytes,
    cuda_workspace_bytes,
    device_memory_bytes,
    expandable_segments_configured,
    is_cuda_device_name,
    workspace_error_bytes,
)
from workbench.estimate.fake_step import FakeStep, cpu_equivalent, fake_train_step
from workbench.estimate.per_rank import fake_world, rank_batch_size
from workbench.estimate.results import BatchSizeSearch, MemoryEstimate, default_budget, search_batch_size
from workbench.workloads import Workload, load_workload

__all__ = [
    "CUBLASLT_WORKSPACE_DEFAULT_KIB",
    "CUBLAS_HANDLES",
    "CUBLAS_WORKSPACE_DEFAULT",
    "CUBLAS_WORKSPACE_HOPPER",
    "CUDA_MIN_BLOCK",
    "CUDA_MIN_LARGE_ALLOC",
    "CUDA_ROUND_LARGE",
    "CUDA_SMALL_SIZE",
    "DEFAULT_USABLE_FRACTION",
    "BatchSizeSearch",
    "FakeStep",
    "MemoryEstimate",
    "cpu_equivalent",
    "cublas_workspace_bytes",
    "cublaslt_workspace_bytes",
    "cuda_block_bytes",
    "cuda_workspace_bytes",
    "default_budget",
    "device_memory_bytes",
    "estimate_memory",
    "expandable_segments_configured",
    "fake_train_step",
    "is_cuda_device_name",
    "max_batch_size",
    "search_batch_size",
    "workspace_error_bytes",
]


def estimate_memory(
    workload: Workload | str,
    config: TrainConfig | None = None,
    device_name: str = "cpu",
    batch_size: int | None = None,
    *,
    preset: str = "tiny",
) -> MemoryEstimate:
    """Estimated peak memory of one steady training step of `workload` under `config` on `device_name`.

    `device_name` is 'cpu' or a GPU name the peak table knows ('H100', 'NVIDIA H200', 'A100 80GB');
    `batch_size` overrides the config's. Runs in seconds on a CPU, whatever the batch size.
    A distributed config (DDP, FSDP2, tensor/sequence parallel) is estimated per rank, the global
    batch split over its data-parallel ranks (`per_rank.fake_world`).
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    config = config or TrainConfig()
    try:
        with (
            fake_world(config) as notes,
            fake_train_step(workload, config, preset=preset, cuda=is_cuda_device_name(device_name)) as fake,
        ):
            estimate = fake.estimate(device_name, rank_batch_size(config, batch_size or fake.default_batch_size))
            estimate.notes.extend(notes)
            return estimate
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        return _real_step_estimate(workload, config, device_name, batch_size, preset, reason=_data_dependent(exc))


def max_batch_size(
    workload: Workload | str,
    config: TrainConfig | None = None,
    device_name: str = "H100",
    memory_budget: int | None = None,
    *,
    preset: str = "tiny",
    limit: int = 1 << 16,
) -> BatchSizeSearch:
    """The largest micro-batch whose estimated peak fits `memory_budget` bytes.

    The default budget is `DEFAULT_USABLE_FRACTION` of the device's memory from the peak table.
    One model is built; every probe is a fake step (see `FakeStep.max_batch_size`).
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    cuda = is_cuda_device_name(device_name)
    try:
        with fake_train_step(workload, config or TrainConfig(), preset=preset, cuda=cuda) as fake:
            return fake.max_batch_size(device_name, memory_budget, limit=limit)
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise ConfigError(
            f"cannot search the largest batch: {_data_dependent(exc)}, so it cannot run on fake tensors and "
            "probing large batches for real would need their memory. Estimate given batch sizes instead "
            "(estimate_memory / `workbench estimate --batch-size N` measure one real CPU step), or run trials"
        ) from None


def _data_dependent(exc: Exception) -> str:
    op = str(exc).strip() or type(exc).__name__
    return (
        f"the step reads tensor values ({op}: .item(), .tolist() or a data-dependent shape, as a DETR-style "
        "matcher in the loss does)"
    )


def _real_step_estimate(
    workload: Workload | str, config: TrainConfig, device_name: str, batch_size: int | None, preset: str, reason: str
) -> MemoryEstimate:
    """The fallback for a step fake tensors cannot run: one real CPU step at the batch size, under
    the same tracker (CUDA rounding applied per storage), after one untracked step for optimizer state."""
    import torch

    from workbench.levers.build import build
    from workbench.measure.memory import track_step_memory

    cuda = is_cuda_device_name(device_name)
    wl = load_workload(workload, preset=preset, **config.extra) if isinstance(workload, str) else workload
    cpu_config, notes = cpu_equivalent(config, cuda=cuda)
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        cpu_config = cpu_config.replace(batch_size=batch_size)
    rng = torch.get_rng_state()
    try:
        step = build(wl, cpu_config, "cpu")
        batches = wl.batches(cpu_config)

        def run() -> Any:
            return step([step.prepare_batch(next(batches)) for _ in range(cpu_config.grad_accumulation)])

        run()
        reading = track_step_memory(step.model, step.optimizer, run, round_bytes=cuda_block_bytes if cuda else None)
    finally:
        torch.set_rng_state(rng)
    workspace = cuda_workspace_bytes(device_name) if cuda else 0
    peak = int(reading.peak_bytes or 0)
    return MemoryEstimate(
        device_name=device_name,
        batch_size=wl.effective_batch_size(cpu_config),
        peak_bytes=peak + workspace,
        tensor_peak_bytes=None if cuda else peak,
        breakdown=dict(reading.breakdown or {}),
        workspace_bytes=workspace,
        device_memory_bytes=device_memory_bytes(device_name),
        modules=dict(reading.modules or {}),
        notes=[f"measured on one real CPU step, not fake tensors: {reason}", *notes],
    )
