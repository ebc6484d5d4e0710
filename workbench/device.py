"""What this machine can do: device facts, each toggle value's availability with a reason.

Availability is probed where probing is cheap and honest (run a tiny SDPA under each
backend, build a fused optimizer) rather than inferred from version numbers. This
module reports; it never decides policy beyond refusing what cannot run.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import warnings
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from workbench.config import COMPILE_MODES_WITH_CUDA_GRAPHS, ConfigError, TrainConfig, field_choices
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
        raise ConfigError(f"device {device!r} asked for, but {_no_cuda_reason()}; use device='cpu'")
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device type '{resolved.type}' is not supported; use 'cpu' or 'cuda'")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ConfigError(f"{device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return resolved


def device_info(device: str | torch.device | None = None) -> DeviceInfo:
    import torch

    dev = resolve_device(device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
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


def pin_memory_supported() -> bool:
    import torch

    return torch.cuda.is_available()


# --- capabilities ------------------------------------------------------------------


def capabilities(device: str | torch.device | None = None) -> dict[str, dict[Any, Availability]]:
    """For every enumerated TrainConfig field: each value → Availability on this device."""
    dev = resolve_device(device)
    return _capabilities_cached(str(dev))


@functools.lru_cache(maxsize=8)
def _capabilities_cached(device_str: str) -> dict[str, dict[Any, Availability]]:
    import torch

    dev = torch.device(device_str)
    caps: dict[str, dict[Any, Availability]] = {}
    for name in (
        "amp",
        "compile",
        "cuda_graphs",
        "matmul_precision",
        "cudnn_tf32",
        "optimizer_impl",
        "attention_backend",
        "pin_memory",
        "strategy",
        "comm_hook",
        "fsdp_param_dtype",
    ):
        choices = field_choices(name) or ()
        caps[name] = {value: _availability(name, value, dev) for value in choices}
    for name in ("compile_fullgraph", "channels_last", "activation_checkpointing", "optimizer", "persistent_workers"):
        caps[name] = dict.fromkeys(field_choices(name) or (), ALWAYS)
    for name in ("ddp_gradient_as_bucket_view", "ddp_static_graph", "fsdp_reshard_after_forward"):
        caps[name] = dict.fromkeys(field_choices(name) or (), ALWAYS)
    # World sizes are integers, not choices: list the usual ones for a control to offer.
    caps["nproc_per_node"] = {n: world_size_availability(n, dev) for n in WORLD_SIZES_SHOWN}
    caps["intra_op_threads"] = _thread_counts(device_info("cpu").cpu_cores)
    caps.update(_lever_capabilities(dev))
    return caps


MEMORY_BUDGETS_SHOWN = (1.0, 0.75, 0.5, 0.25, 0.0)
"""activation_memory_budget values `capabilities()` lists (any value from 0 to 1 is valid)."""


def _lever_capabilities(dev: torch.device) -> dict[str, dict[Any, Availability]]:
    """The compiler- and hardware-level levers (memory budget, ...), each value with its reason."""
    return {
        "activation_memory_budget": {b: _memory_budget(b, dev) for b in MEMORY_BUDGETS_SHOWN},
        "compiled_autograd": {False: ALWAYS, True: _compiled_autograd(dev)},
        "float8": {r: _float8(r, dev) for r in field_choices("float8") or ()},
        # Any module pattern is valid; 'auto' stands for them all (check_config judges any value).
        "activation_offload": {"off": ALWAYS, "auto": _activation_offload(dev)},
    }


def _activation_offload(dev: torch.device) -> Availability:
    if dev.type != "cuda":
        return Availability(
            False,
            f"offload moves saved activations from GPU memory to host memory; on a {dev.type} device they "
            "already live in host memory, so there is nothing to gain",
        )
    return Availability(True, "trades PCIe copy time for GPU memory; under compile a graph break per module")


def _float8(recipe: str, dev: torch.device) -> Availability:
    if recipe == "off":
        return ALWAYS
    from workbench.levers.float8 import FLOAT8_CAPABILITY, INSTALL_HINT

    need = ".".join(map(str, FLOAT8_CAPABILITY))
    if dev.type != "cuda":
        return Availability(
            False,
            f"float8 training needs float8 tensor cores: an NVIDIA GPU of compute capability {need}+ "
            f"(Ada, Hopper or newer); this trial runs on {dev.type}",
        )
    capability = _cuda_capability(dev)
    if capability < FLOAT8_CAPABILITY:
        return Availability(
            False, f"this GPU is compute capability {capability[0]}.{capability[1]}: float8 GEMMs need {need}+"
        )
    if importlib.util.find_spec("torchao") is None:
        return Availability(False, f"float8 training needs torchao, which is not installed: {INSTALL_HINT}")
    return Availability(True, "needs compile on; converts only the nn.Linear layers large enough to gain")


def _compiled_autograd(dev: torch.device) -> Availability:
    compiled = _compile("default", dev)
    if not compiled.available:
        return Availability(
            False, f"compiles the backward with torch.compile, which cannot run here: {compiled.reason}"
        )
    from workbench.levers.compiled_autograd import CompiledAutogradUnavailable, compiled_autograd_api

    try:
        compiled_autograd_api()
    except CompiledAutogradUnavailable as exc:
        return Availability(False, str(exc))
    return Availability(True, "needs compile on; adds a backward compile (and recompiles when the graph changes)")


def _memory_budget(budget: float, dev: torch.device) -> Availability:
    if budget >= 1.0:
        return Availability(True, "off: the compiler saves what is fastest to keep (PyTorch's default)")
    compiled = _compile("default", dev)
    if not compiled.available:
        return Availability(False, f"acts through torch.compile, which cannot run here: {compiled.reason}")
    from workbench.levers.memory_budget import MemoryBudgetUnavailable, functorch_config

    try:
        functorch_config()
    except MemoryBudgetUnavailable as exc:
        return Availability(False, str(exc))
    return Availability(
        True, f"needs compile on: keeps {budget:.0%} of the compiled graph's saved activations, recomputes the rest"
    )


def _thread_counts(cores: int) -> dict[int | None, Availability]:
    """Intra-op thread counts worth trying here (a search space for the tuner, choices for the app):
    PyTorch's own pick, powers of two below the cores, and the cores. More is allowed, never useful."""
    counts = sorted({*(2**k for k in range(cores.bit_length()) if 2**k < cores), cores})
    table: dict[int | None, Availability] = {None: Availability(True, "PyTorch's default: the cores it sees")}
    table.update(dict.fromkeys(counts, ALWAYS))
    return table


def check_config(config: TrainConfig, device: str | torch.device | None = None) -> None:
    """Raise ConfigError when the config asks for something this device cannot do."""
    dev = resolve_device(device)
    caps = capabilities(dev)
    for name, table in caps.items():
        value = getattr(config, name)
        availability = table.get(value)
        if availability is not None and not availability.available:
            raise ConfigError(f"{name}={value} is not available on {dev}: {availability.reason}")
    if config.activation_offload != "off":
        offload = caps["activation_offload"]["auto"]  # the same for every module pattern
        if not offload.available:
            raise ConfigError(
                f"activation_offload={config.activation_offload} is not available on {dev}: {offload.reason}"
            )
    if config.strategy != "none":
        world = world_size_availability(config.nproc_per_node, dev)
        if not world.available:
            raise ConfigError(f"nproc_per_node={config.nproc_per_node} is not available on {dev}: {world.reason}")
    if config.compile != "off" and config.compile_backend not in _known_backends():
        raise ConfigError(
            f"compile_backend '{config.compile_backend}' is not registered; choose one of: {', '.join(_known_backends())}"
        )


def capabilities_report(device: str | torch.device | None = None) -> dict[str, Any]:
    """Plain data for the CLI/JSON/UI: device facts plus every value's availability."""
    info = device_info(device)
    caps = capabilities(device)
    return {
        "device": info.to_dict(),
        "toggles": {
            name: {_key(v): {"available": a.available, "reason": a.reason} for v, a in table.items()}
            for name, table in caps.items()
        },
    }


def _key(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _availability(name: str, value: Any, dev: torch.device) -> Availability:
    probe = _PROBES.get(name)
    return probe(value, dev) if probe else ALWAYS


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


def _cuda_capability(dev: torch.device) -> tuple[int, int]:
    """Compute capability of `dev` itself (not of the current device)."""
    import torch

    major, minor = torch.cuda.get_device_capability(dev)
    return int(major), int(minor)


def _amp(value: str, dev: torch.device) -> Availability:
    if value == "fp32":
        return ALWAYS
    if dev.type == "cuda":
        return bf16_availability(_cuda_capability(dev)) if value == "bf16" else ALWAYS
    if value == "fp16":
        return Availability(True, "runs on CPU, but CPUs without fp16 matrix units (no AMX-FP16) are slower than fp32")
    return ALWAYS


def _compile(value: str, dev: torch.device) -> Availability:
    if value == "off":
        return ALWAYS
    if dev.type == "cpu" and value in COMPILE_MODES_WITH_CUDA_GRAPHS:
        if value == "reduce-overhead":
            return Availability(
                False, "reduce-overhead works by capturing CUDA graphs; on CPU it would silently equal 'default'"
            )
        return Availability(True, "on CPU max-autotune tunes CPU kernels only (no CUDA graphs); expect long compiles")
    if dev.type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return Availability(False, "inductor needs a C++ compiler on CPU; install g++ (apt-get install g++)")
    if dev.type == "cuda" and importlib.util.find_spec("triton") is None:
        return Availability(False, "inductor needs Triton on CUDA; pip install triton")
    return ALWAYS


def _cuda_graphs(value: bool, dev: torch.device) -> Availability:
    if not value or dev.type == "cuda":
        return ALWAYS
    return Availability(False, f"CUDA graphs need a CUDA device; this trial runs on {dev.type} ({_no_cuda_reason()})")


def _matmul_precision(value: str, dev: torch.device) -> Availability:
    import torch

    if value == "highest":
        return ALWAYS
    if dev.type != "cuda":
        return Availability(False, "TF32 is an NVIDIA Ampere+ tensor-core mode; on CPU this setting changes nothing")
    major, _ = torch.cuda.get_device_capability(dev)
    if major < 8:
        return Availability(False, f"TF32 needs compute capability 8.0+, this GPU is {major}.x")
    return ALWAYS


def _cudnn_tf32(value: bool, dev: torch.device) -> Availability:
    """On is PyTorch's default everywhere (the flag is set, harmlessly, on CPU too); off is
    refused where it would change nothing, as matmul_precision's TF32 values are."""
    import torch

    if value:
        return ALWAYS
    if dev.type != "cuda":
        return Availability(
            False, "cuDNN TF32 is an NVIDIA Ampere+ convolution mode; on CPU turning it off changes nothing"
        )
    if not torch.backends.cudnn.is_available():
        return Availability(False, "this PyTorch build has no cuDNN, so no convolution uses TF32 to turn off")
    major, _ = torch.cuda.get_device_capability(dev)
    if major < 8:
        return Availability(
            False, f"TF32 needs compute capability 8.0+, this GPU is {major}.x: its convolutions are fp32"
        )
    return ALWAYS


def _optimizer_impl(value: str, dev: torch.device) -> Availability:
    if value == "default":
        from workbench.levers.optimizer import default_impl_on

        return Availability(True, f"PyTorch's choice on {dev.type}: {default_impl_on(dev.type)}")
    if value != "fused":
        return ALWAYS
    import torch

    param = torch.zeros(4, device=dev, requires_grad=True)
    param.grad = torch.ones_like(param)
    try:
        torch.optim.AdamW([param], fused=True).step()
    except (RuntimeError, ValueError) as exc:
        return Availability(False, f"fused AdamW is not supported here: {_first_line(exc)}")
    return ALWAYS


def _attention_backend(value: str, dev: torch.device) -> Availability:
    if value == "auto":
        return ALWAYS
    if value == "flex":
        return _flex_attention(dev)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "math": SDPBackend.MATH,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[value]
    # Probed in a dtype the device runs natively: emulated bf16 on a pre-Ampere GPU would mark
    # backends unavailable that run in fp16 there.
    dtype = native_half_dtype(_cuda_capability(dev)) if dev.type == "cuda" else torch.float32
    q = torch.randn(1, 2, 16, 64, device=dev, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, q, q)
        except RuntimeError:
            why = "; ".join(_first_line(w.message) for w in caught) or "PyTorch has no such kernel for this device"
            dtype_name = str(dtype).removeprefix("torch.")
            return Availability(False, f"the {value} SDPA kernel cannot run on {dev.type} in {dtype_name}: {why}")
    return ALWAYS


def _flex_attention(dev: torch.device) -> Availability:
    """FlexAttention must run forward *and* backward here: training needs both (torch 2.13 has no
    CPU backward, eager or compiled)."""
    import torch

    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return Availability(False, f"torch {torch.__version__} has no torch.nn.attention.flex_attention (2.5+)")
    q = torch.randn(1, 1, 16, 16, device=dev, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the probe runs eagerly on purpose; PyTorch warns about that
        try:
            flex_attention(q, q, q).sum().backward()
        except (NotImplementedError, RuntimeError) as exc:
            return Availability(
                False, f"FlexAttention cannot train on {dev.type} in torch {torch.__version__}: {_first_line(exc)}"
            )
    return Availability(True, "needs compile on: FlexAttention's fused kernel exists only under torch.compile")


def _pin_memory(value: bool, dev: torch.device) -> Availability:
    if not value or dev.type == "cuda":
        return ALWAYS
    return Availability(False, "pinned memory speeds host-to-GPU copies; there is no GPU to copy to")


WORLD_SIZES_SHOWN = (1, 2, 4, 8)
"""nproc_per_node values `capabilities()` lists; `check_config` judges any value."""

CPU_RANKS_MAX_FLOOR = 2
"""Gloo ranks allowed on CPU even with fewer cores: the smallest world that exercises the real path."""


def distributed_backend(dev: torch.device) -> str:
    """The collective backend for a device type: NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if dev.type == "cuda" else "gloo"


def world_size_availability(nproc: int, dev: torch.device) -> Availability:
    """Can this node run `nproc` ranks? One GPU per rank on CUDA; a small gloo world on CPU."""
    if dev.type == "cuda":
        import torch

        count = torch.cuda.device_count()
        if nproc > count:
            return Availability(False, f"this machine has {count} CUDA device(s); each rank needs its own GPU")
        return ALWAYS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = max(CPU_RANKS_MAX_FLOOR, cores)
    if nproc > limit:
        return Availability(
            False,
            f"{nproc} gloo ranks on {cores} CPU core(s) would time-share cores; the step times would mean nothing",
        )
    return Availability(True, "gloo ranks on CPU cores, one thread each: shows the mechanics, not GPU speed")


def _strategy(value: str, dev: torch.device) -> Availability:
    if value == "none":
        return ALWAYS
    import torch.distributed as dist

    if not dist.is_available():
        return Availability(False, "this PyTorch build has no torch.distributed")
    backend = distributed_backend(dev)
    if not (dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()):
        return Availability(False, f"this PyTorch build has no {backend} backend")
    if value == "fsdp2" and importlib.util.find_spec("torch.distributed.fsdp") is None:
        return Availability(False, "FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6")
    return ALWAYS


def _comm_hook(value: str, dev: torch.device) -> Availability:
    if value == "bf16" and distributed_backend(dev) != "nccl":
        return Availability(
            False,
            "DDP's bf16_compress_hook requires CUDA 11+ and NCCL 2.10+; PyTorch refuses it on gloo: use comm_hook=fp16",
        )
    if value == "bf16":
        import torch

        version = tuple(torch.cuda.nccl.version()) if torch.distributed.is_nccl_available() else ()
        if version < (2, 10):
            return Availability(False, f"DDP's bf16_compress_hook needs NCCL 2.10+, this build has {version or 'none'}")
    if value == "fp16" and dev.type == "cpu":
        return Availability(True, "on CPU the casts cost about what the halved bytes save over local gloo")
    return ALWAYS


def _fsdp_param_dtype(value: str, dev: torch.device) -> Availability:
    if value == "bf16" and dev.type == "cuda":
        return bf16_availability(_cuda_capability(dev))
    return ALWAYS


_PROBES: dict[str, Any] = {
    "amp": _amp,
    "compile": _compile,
    "cuda_graphs": _cuda_graphs,
    "matmul_precision": _matmul_precision,
    "cudnn_tf32": _cudnn_tf32,
    "optimizer_impl": _optimizer_impl,
    "attention_backend": _attention_backend,
    "pin_memory": _pin_memory,
    "strategy": _strategy,
    "comm_hook": _comm_hook,
    "fsdp_param_dtype": _fsdp_param_dtype,
}


@functools.lru_cache(maxsize=1)
def _known_backends() -> tuple[str, ...]:
    import torch._dynamo

    return tuple(torch._dynamo.list_backends(exclude_tags=()))


def _no_cuda_reason() -> str:
    import torch

    if torch.version.cuda is None:
        return f"this PyTorch build ({torch.__version__}) is CPU-only"
    return "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"


def _first_line(obj: object) -> str:
    return str(obj).strip().splitlines()[0] if str(obj).strip() else type(obj).__name__


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
