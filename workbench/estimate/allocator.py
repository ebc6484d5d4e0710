"""The CUDA caching allocator and cuBLAS workspaces, modelled: what `max_memory_allocated` adds to
the tensors' own bytes on a GPU this machine may not have (block rounding, whole large blocks,
the workspaces cuBLAS keeps per handle)."""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING

from workbench.peak_specs import DeviceSpec, lookup_spec

if TYPE_CHECKING:
    pass

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
