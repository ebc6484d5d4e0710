"""Device facts: what this machine is (kind, name, memory, compute capability, native dtypes).

Which lever values run here is each lever's own question (`workbench.levers`, which asks this
module); this module knows nothing of levers, so the layers point one way.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError
from workbench.peak_specs import DeviceSpec, lookup_spec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Availability:
    """Whether a toggle value can run here; `reason` says why not (or a caveat when it can)."""

    available: bool
    reason: str = ""


@dataclass(frozen=True)
class DeviceInfo:
    type: str
    """'cpu' or 'cuda'."""
    name: str
    count: int
    """Accelerators of this type visible to the process (CPU: 1)."""
    cpu_cores: int
    total_memory_bytes: int | None
    compute_capability: tuple[int, int] | None
    torch_version: str
    cuda_version: str | None
    spec: DeviceSpec | None
    """Peak FLOP/s and bandwidth from the table, when this device is in it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ALWAYS = Availability(True)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None → the first CUDA device when there is one, else the CPU. Unknown devices fail clearly."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"unknown device {device!r} ({exc}); use 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but {no_cuda_reason()}; use device='cpu'")
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device type '{resolved.type}' is not supported; use 'cpu' or 'cuda'")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ConfigError(f"{device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return resolved


def device_info(device: str | torch.device | None = None) -> DeviceInfo:
    import torch

    dev = resolve_device(device)
    cores = cpu_cores()
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return DeviceInfo(
            type="cuda",
            name=props.name,
            count=torch.cuda.device_count(),
            cpu_cores=cores,
            total_memory_bytes=int(props.total_memory),
            compute_capability=(props.major, props.minor),
            torch_version=torch.__version__,
            cuda_version=torch.version.cuda,
            spec=lookup_spec(props.name),
        )
    return DeviceInfo(
        type="cpu",
        name=_cpu_name(),
        count=1,
        cpu_cores=cores,
        total_memory_bytes=_host_memory(),
        compute_capability=None,
        torch_version=torch.__version__,
        cuda_version=None,
        spec=None,
    )


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pin_memory_supported() -> bool:
    import torch

    return torch.cuda.is_available()


BF16_NATIVE_CAPABILITY = (8, 0)
"""Ampere: the first NVIDIA generation whose tensor cores run bfloat16."""


def bf16_availability(capability: tuple[int, int]) -> Availability:
    """bf16 on a CUDA device of this compute capability: offered only where the hardware runs it.

    `torch.cuda.is_bf16_supported()` says True on V100/T4 too, because bf16 kernels *emulate*
    there (fp32 math behind conversions): slower than fp16, so offering it would mislead.
    """
    if tuple(capability) >= BF16_NATIVE_CAPABILITY:
        return ALWAYS
    major, minor = capability
    return Availability(
        False,
        f"this GPU is compute capability {major}.{minor}: bfloat16 is only emulated there (slower than fp16); "
        "native bf16 needs 8.0+ (Ampere or newer); use fp16",
    )


def native_half_dtype(capability: tuple[int, int]) -> torch.dtype:
    """The 16-bit float a CUDA device of this capability runs natively: bf16 from Ampere on, else fp16."""
    import torch

    return torch.bfloat16 if bf16_availability(capability).available else torch.float16


def cuda_capability(dev: torch.device) -> tuple[int, int]:
    """Compute capability of `dev` itself (not of the current device)."""
    import torch

    major, minor = torch.cuda.get_device_capability(dev)
    return int(major), int(minor)


def distributed_backend(dev: torch.device) -> str:
    """The collective backend for a device type: NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if dev.type == "cuda" else "gloo"


def no_cuda_reason() -> str:
    import torch

    if torch.version.cuda is None:
        return f"this PyTorch build ({torch.__version__}) is CPU-only"
    return "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def _host_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        return None


# Deprecation shim for one release: these names moved to workbench.levers (each lever answers for
# its own values). The lazy import below is the only place this module reaches for levers, and it
# goes away with the shim.
_MOVED_TO_LEVERS = {
    "capabilities": "workbench.levers",
    "check_config": "workbench.levers",
    "capabilities_report": "workbench.levers",
    "world_size_availability": "workbench.levers.distributed",
    "WORLD_SIZES_SHOWN": "workbench.levers.distributed",
    "CPU_RANKS_MAX_FLOOR": "workbench.levers.distributed",
    "MEMORY_BUDGETS_SHOWN": "workbench.levers.memory_budget",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_LEVERS:
        import importlib
        import warnings

        home = _MOVED_TO_LEVERS[name]
        warnings.warn(
            f"workbench.device.{name} moved to {home}.{name}; import it from there "
            "(the old name goes away in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cpu_bf16_native() -> bool:
    """Whether this CPU has bf16 instructions (AVX-512 BF16 or AMX tiles), as PyTorch's own CPU
    feature check reports. Where it does, bf16 is kept without a timing: the short probe below swung
    from 0.7x to over 50x on one such host under load from other processes, and a slow draw dropped
    the one lever worth most on it."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


@functools.cache
def cpu_bf16_speedup() -> float:
    """How much faster bf16 autocast runs a small MLP's forward and backward than fp32 on this CPU (best
    of five, measured once per process, well under 0.1 s). Below 1 the CPU only emulates bf16: hosts
    of one kind differ (some have AVX-512 BF16 or AMX and run it 1.4-2x faster, others convert in
    software and run it several times slower), so the CPU's name does not say; a measurement does."""
    import time

    import torch

    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512))
    x = torch.randn(256, 512, generator=generator)

    def best(enabled: bool) -> float:
        times = []
        for _ in range(5):
            began = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                out = layer(x).float().pow(2).mean()
            out.backward()
            times.append(time.perf_counter() - began)
        return min(times)

    best(True)  # first use: kernel selection, allocator
    return best(False) / best(True)
