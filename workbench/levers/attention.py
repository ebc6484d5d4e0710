"""Scaled-dot-product-attention backend: force one SDPA kernel instead of PyTorch's choice.

The context covers forward *and* backward: the backward kernel of the chosen backend must
match its forward, and a forced kernel that cannot run raises instead of silently falling
back, so a measurement never credits a backend that did not run.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.config import ConfigError
from workbench.device import ALWAYS, Availability, cuda_capability, native_half_dtype
from workbench.levers.amp import ContextFactory
from workbench.levers.base import Lever, first_line, probed
from workbench.levers.record import Applied

BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def apply_attention_backend(backend: str) -> tuple[ContextFactory | None, Applied | None]:
    """A `sdpa_kernel` context factory, or (None, None) for 'auto' and for 'flex' (which replaces
    the attention call in the model itself: `levers.flex_attention`)."""
    if backend in ("auto", "flex"):
        return None, None
    if backend not in BACKENDS:
        raise ConfigError(f"attention_backend={backend!r} is not valid; choose one of: auto, {', '.join(BACKENDS)}")
    chosen = BACKENDS[backend]

    def context() -> AbstractContextManager[None]:
        return sdpa_kernel(chosen)

    detail = f"sdpa_kernel({chosen.name}) around forward and backward; other SDPA kernels disabled"
    return context, Applied("attention_backend", backend, detail)


def attention_availability(value: str, dev: torch.device) -> Availability:
    if value == "auto":
        return ALWAYS
    if value == "flex":
        from workbench.levers.flex_attention import flex_availability

        return flex_availability(dev)
    # Probed in a dtype the device runs natively: emulated bf16 on a pre-Ampere GPU would mark
    # backends unavailable that run in fp16 there.
    dtype = native_half_dtype(cuda_capability(dev)) if dev.type == "cuda" else torch.float32
    q = torch.randn(1, 2, 16, 64, device=dev, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(BACKENDS[value]):
                F.scaled_dot_product_attention(q, q, q)
        except RuntimeError:
            why = "; ".join(first_line(w.message) for w in caught) or "PyTorch has no such kernel for this device"
            dtype_name = str(dtype).removeprefix("torch.")
            return Availability(False, f"the {value} SDPA kernel cannot run on {dev.type} in {dtype_name}: {why}")
    return ALWAYS


LEVER = Lever(
    name="attention_backend",
    fields=("attention_backend",),
    summary="force one SDPA kernel (flash, efficient, cuDNN, math) or FlexAttention instead of PyTorch's pick",
    availability=probed(attention_backend=attention_availability),
)
