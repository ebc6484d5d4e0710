"""float32 matmul precision (TF32 on NVIDIA Ampere+), scoped to the step instead of set globally.

`torch.set_float32_matmul_precision` is process-global; setting it for good would leak one
trial's choice into the next trial run in the same process (inline mode, tests). The context
sets it on entry and restores the previous value on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from workbench.config import ConfigError
from workbench.optimizations.amp import ContextFactory
from workbench.optimizations.record import Applied

PRECISIONS = ("highest", "high", "medium")


@contextmanager
def matmul_precision(precision: str, device: torch.device) -> Iterator[None]:
    """Set float32 matmul precision (and cuDNN's TF32 switch on CUDA) until the block exits."""
    previous = torch.get_float32_matmul_precision()
    previous_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision(precision)
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = precision != "highest"
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
        torch.backends.cudnn.allow_tf32 = previous_cudnn


def apply_matmul_precision(precision: str, device: torch.device) -> tuple[ContextFactory | None, Applied | None]:
    """A context factory for the step; (None, None) for 'highest' on CPU (PyTorch's default).

    On CUDA 'highest' still gets a context: PyTorch allows TF32 in cuDNN convolutions by
    default, so without it an "fp32" baseline would quietly convolve in TF32.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"matmul_precision={precision!r} is not valid; choose one of: {', '.join(PRECISIONS)}")

    def context() -> AbstractContextManager[None]:
        return matmul_precision(precision, device)

    if precision == "highest":
        return (context, None) if device.type == "cuda" else (None, None)

    detail = f"torch.set_float32_matmul_precision('{precision}') for the step, restored after it"
    if device.type == "cuda":
        detail += "; cuDNN TF32 allowed for convolutions"
    return context, Applied("matmul_precision", precision, detail)
