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

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError, TrainConfig
from workbench.peak_specs import DeviceSpec, lookup_spec
from workbench.workloads import Workload, load_workload

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

# The CUDA caching allocator's constants (c10/cuda/CUDACachingAllocator.cpp):
#: kMinBlockSize: every block is a multiple of 512 bytes.
CUDA_MIN_BLOCK = 512
#: kSmallSize: requests up to 1 MiB come from the small pool; a large-pool block is split only
#: when more than this would remain (should_split), else the whole block is handed out and counted.
CUDA_SMALL_SIZE = 1 << 20
#: kMinLargeAlloc: a request from here up gets a segment of its own (smaller ones share 20 MiB ones)...
CUDA_MIN_LARGE_ALLOC = 10 << 20
#: kRoundLarge: ...rounded up to a multiple of 2 MiB.
CUDA_ROUND_LARGE = 2 << 20
#: cuBLAS workspace per (handle, stream), from the caching allocator (aten/src/ATen/cuda/CublasHandlePool.cpp,
#: parseChosenWorkspaceSize): 32 MiB on Hopper and Blackwell, else ":4096:2:16:8" (4096 KiB * 2 + 16 KiB * 8);
#: CUBLAS_WORKSPACE_CONFIG=":SIZE_KIB:COUNT..." replaces either.
CUBLAS_WORKSPACE_HOPPER = 4096 * 8 * 1024
CUBLAS_WORKSPACE_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
#: cuBLASLt's own workspace (CUBLASLT_WORKSPACE_SIZE, KiB; 1024 by default): a separate allocation in
#: some PyTorch versions, carved from the cuBLAS one in others — carried in the error bound.
CUBLASLT_WORKSPACE_DEFAULT_KIB = 1024
#: Forward runs on the caller's thread, backward on autograd's device thread: two cuBLAS handles.
CUBLAS_HANDLES = 2
#: Device names whose default cuBLAS workspace is 32 MiB (compute capability 9.x, 10.x, 12.x).
_LARGE_WORKSPACE_PARTS = ("H100", "H200", "GH200", "H800", "H20", "B100", "B200", "GB200", "B300", "RTX 50", "RTX PRO")
#: Share of a GPU's memory a step may plan to allocate: the CUDA context, fragmentation
#: (reserved > allocated) and other processes need the rest.
DEFAULT_USABLE_FRACTION = 0.9


@dataclass
class MemoryEstimate:
    device_name: str
    batch_size: int
    peak_bytes: int
    """Estimated peak allocated memory (comparable with `max_memory_allocated` on CUDA)."""
    tensor_peak_bytes: int | None
    """The same peak in exact tensor bytes (CPU); None on CUDA, where only the rounded step runs."""
    breakdown: dict[str, int]
    workspace_bytes: int
    device_memory_bytes: int | None
    modules: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error_bound_bytes: int = 0
    """The real peak may differ from `peak_bytes` by up to this (CUDA): allocator block reuse
    (<= 1 MiB per large tensor) and the cuBLAS workspaces' dependence on version and environment."""

    @property
    def fits(self) -> bool | None:
        if self.device_memory_bytes is None:
            return None
        return self.peak_bytes <= self.device_memory_bytes * DEFAULT_USABLE_FRACTION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fits"] = self.fits
        return data

    def to_text(self) -> str:
        from workbench.textfmt import format_bytes

        total = format_bytes(self.device_memory_bytes) if self.device_memory_bytes else "unknown"
        fits = {True: "fits", False: "does NOT fit", None: "?"}[self.fits]
        lines = [
            f"{self.device_name}, batch {self.batch_size}: peak ≈ {format_bytes(self.peak_bytes)} "
            f"of {total} ({fits} in {DEFAULT_USABLE_FRACTION:.0%})",
            "  " + ", ".join(f"{k} {format_bytes(v)}" for k, v in self.breakdown.items() if v),
        ]
        if self.workspace_bytes:
            lines.append(f"  + cuBLAS workspaces {format_bytes(self.workspace_bytes)}")
        top = sorted(((n, m["activations"]) for n, m in self.modules.items() if n), key=lambda kv: -kv[1])[:5]
        if top:
            lines.append("  most activations: " + ", ".join(f"{n} {format_bytes(v)}" for n, v in top))
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


@dataclass
class BatchSizeSearch:
    device_name: str
    memory_budget_bytes: int
    max_batch_size: int
    """Largest batch whose estimated peak fits the budget (0: not even batch 1)."""
    estimate: MemoryEstimate | None
    """The estimate at `max_batch_size`."""
    probes: dict[int, int] = field(default_factory=dict)
    """Every batch size tried → its estimated peak bytes."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        from workbench.textfmt import format_bytes

        head = (
            f"{self.device_name}: largest batch that fits {format_bytes(self.memory_budget_bytes)} "
            f"is {self.max_batch_size}"
        )
        return head + ("\n" + self.estimate.to_text() if self.estimate else "")


# --- the allocator model -------------------------------------------------------------------


def cuda_block_bytes(nbytes: int, *, expandable_segments: bool | None = None) -> int:
    """What the CUDA caching allocator counts as allocated for a request of `nbytes` (0 stays 0).

    Every request is rounded up to 512 bytes. One of 10 MiB or more gets its own segment,
    rounded up to 2 MiB, and the allocator splits the rest off only when more than 1 MiB
    would remain; otherwise the whole segment is the block, and `max_memory_allocated`
    counts all of it (11 MiB → 12 MiB). In a steady step each size reuses its own block, so
    this holds; a block of another size reused instead can add or save up to 1 MiB (see
    `error_bound_bytes`). With expandable segments blocks are split down to 512 bytes.
    """
    if nbytes <= 0:
        return 0
    rounded = max(CUDA_MIN_BLOCK, math.ceil(nbytes / CUDA_MIN_BLOCK) * CUDA_MIN_BLOCK)
    if expandable_segments is None:
        expandable_segments = expandable_segments_configured()
    if expandable_segments or rounded < CUDA_MIN_LARGE_ALLOC:
        return rounded
    segment = math.ceil(rounded / CUDA_ROUND_LARGE) * CUDA_ROUND_LARGE
    return segment if segment - rounded <= CUDA_SMALL_SIZE else rounded


def expandable_segments_configured(env: dict[str, str] | None = None) -> bool:
    """Whether PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) turns expandable segments on."""
    env = dict(os.environ) if env is None else env
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""
    return bool(re.search(r"expandable_segments\s*:\s*true", conf, flags=re.IGNORECASE))


def is_cuda_device_name(device_name: str) -> bool:
    name = device_name.strip().lower()
    return name not in ("cpu", "host") and not name.startswith("cpu")


def cublas_workspace_bytes(device_name: str, env: dict[str, str] | None = None) -> int:
    """One cuBLAS handle's workspace: CUBLAS_WORKSPACE_CONFIG when set, else PyTorch's default for the part."""
    env = dict(os.environ) if env is None else env
    pairs = re.findall(r":([0-9]+):([0-9]+)", env.get("CUBLAS_WORKSPACE_CONFIG", ""))
    if pairs:
        return sum(int(size_kib) * 1024 * int(count) for size_kib, count in pairs)
    large = any(part in device_name.upper() for part in _LARGE_WORKSPACE_PARTS)
    return CUBLAS_WORKSPACE_HOPPER if large else CUBLAS_WORKSPACE_DEFAULT


def cuda_workspace_bytes(device_name: str, env: dict[str, str] | None = None) -> int:
    """cuBLAS workspaces a training step leaves allocated (they count in max_memory_allocated)."""
    return CUBLAS_HANDLES * cublas_workspace_bytes(device_name, env)


def cublaslt_workspace_bytes(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ) if env is None else env
    value = env.get("CUBLASLT_WORKSPACE_SIZE", "")
    return (int(value) if value.isdigit() else CUBLASLT_WORKSPACE_DEFAULT_KIB) * 1024


def workspace_error_bytes(device_name: str, env: dict[str, str] | None = None) -> int:
    """How far the modelled workspaces may be off, whichever PyTorch version runs the step.

    Up: versions that keep cuBLASLt's workspace apart add one per handle. Down: versions
    that allocate the cuBLAS workspace per call (no TORCH_CUBLAS_WORKSPACE_CACHE) hold at
    most one, and only while a matmul runs; versions before Blackwell's 32 MiB default give
    those parts the small default.
    """
    return max(CUBLAS_HANDLES * cublaslt_workspace_bytes(env), cuda_workspace_bytes(device_name, env))


def device_memory_bytes(device_name: str) -> int | None:
    """Total memory of a named device: the peak table for GPUs, this host's RAM for 'cpu'."""
    if not is_cuda_device_name(device_name):
        from workbench.device import device_info

        return device_info("cpu").total_memory_bytes
    spec: DeviceSpec | None = lookup_spec(device_name)
    return int(spec.memory_bytes) if spec else None


# --- public API ------------------------------------------------------------------------------


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
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    config = config or TrainConfig()
    try:
        with fake_train_step(workload, config, preset=preset, cuda=is_cuda_device_name(device_name)) as fake:
            return fake.estimate(device_name, batch_size or fake.default_batch_size)
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


def _search(fits: Callable[[int], bool], peak: dict[int, int], budget: int, limit: int) -> int:
    """Largest size with fits(size), assuming memory grows with the batch about linearly.

    Probes 1 and 4, then secant steps through the two latest probes (a linear function is
    solved in one), then the neighbour of the best fit, then bisection for whatever is left:
    typically five fake steps instead of the dozen of doubling and bisection.
    """
    if not fits(1):
        return 0
    low, high = 1, limit + 1
    if not fits(4):
        high = 4
    else:
        low, previous, latest = 4, 1, 4
        for _ in range(4):
            slope = max(1.0, (peak[latest] - peak[previous]) / (latest - previous))
            guess = int(min(limit, max(low + 1, latest + (budget - peak[latest]) // slope)))
            if guess >= high or guess in peak:
                break
            low, high = (guess, high) if fits(guess) else (low, guess)
            previous, latest = latest, guess
        if high - low > 1 and low + 1 <= limit:
            low, high = (low + 1, high) if fits(low + 1) else (low, low + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _default_budget(device_name: str) -> int:
    total = device_memory_bytes(device_name)
    if total is None:
        raise ConfigError(
            f"device '{device_name}' is not in the peak table; pass memory_budget (bytes) or a known name "
            "such as H100, H200, A100 80GB, L40S"
        )
    return int(total * DEFAULT_USABLE_FRACTION)


# --- the fake step ---------------------------------------------------------------------------


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
        budget = memory_budget if memory_budget is not None else _default_budget(device_name)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ConfigError(f"memory_budget must be a positive number of bytes, got {budget!r}")
        probes: dict[int, MemoryEstimate] = {}
        peaks: dict[int, int] = {}

        def fits(size: int) -> bool:
            probes[size] = self.estimate(device_name, size)
            peaks[size] = probes[size].peak_bytes
            return peaks[size] <= budget

        best = _search(fits, peaks, budget, limit)
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
